#include <ditrl/error.hpp>
#include <ditrl/io/safetensors.hpp>
#include <ditrl/rollout/decoder.hpp>
#include <ditrl/rollout/http_reward.hpp>

#include <ATen/ATen.h>
#include <curl/curl.h>
#include <fmt/format.h>
#include <spdlog/spdlog.h>
#include <boost/json.hpp>

#include <atomic>
#include <chrono>
#include <cmath>
#include <mutex>
#include <optional>
#include <thread>

namespace ditrl::rollout {

namespace {

constexpr int64_t kProtocol = 1;

struct CurlDeleter {
  void operator()(CURL* handle) const { curl_easy_cleanup(handle); }
};
struct HeaderListDeleter {
  void operator()(curl_slist* list) const { curl_slist_free_all(list); }
};
using CurlHandle = std::unique_ptr<CURL, CurlDeleter>;
using HeaderList = std::unique_ptr<curl_slist, HeaderListDeleter>;

// curl_global_init is not thread-safe: it runs once, before any request
// thread exists (make_http_reward runs on the main thread).
void init_curl_once() {
  static std::once_flag once;
  std::call_once(once, [] {
    if (curl_global_init(CURL_GLOBAL_DEFAULT) != CURLE_OK) fail("reward server: curl_global_init failed");
  });
}

size_t append_body(char* data, size_t size, size_t count, void* body) {
  static_cast<std::string*>(body)->append(data, size * count);
  return size * count;
}

// One HTTP exchange: the transport's error (empty when it completed) or the
// status and body the server answered.
struct Exchange {
  std::string transport_error;
  long status = 0;
  std::string body;
};

Exchange exchange(const std::string& url, const std::string* post_body, double timeout_s) {
  CurlHandle curl(curl_easy_init());
  if (!curl) fail("reward server {}: curl_easy_init failed", url);
  CURL* c = curl.get();
  Exchange out;
  char error[CURL_ERROR_SIZE] = {0};
  HeaderList headers;
  curl_easy_setopt(c, CURLOPT_URL, url.c_str());
  curl_easy_setopt(c, CURLOPT_HTTP_VERSION, CURL_HTTP_VERSION_1_1);
  // Threads: no signal-based DNS timeouts. Reward servers sit on loopback or
  // the cluster network, never behind the environment's web proxy.
  curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(c, CURLOPT_NOPROXY, "*");
  curl_easy_setopt(c, CURLOPT_TIMEOUT_MS, static_cast<long>(std::ceil(timeout_s * 1000)));
  curl_easy_setopt(c, CURLOPT_ERRORBUFFER, error);
  curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, append_body);
  curl_easy_setopt(c, CURLOPT_WRITEDATA, &out.body);
  if (post_body) {
    // "Expect:" off: curl would otherwise wait for a 100 Continue before a large body.
    curl_slist* list = curl_slist_append(nullptr, "Content-Type: application/octet-stream");
    headers.reset(list);
    headers.reset(curl_slist_append(headers.release(), "Expect:"));
    curl_easy_setopt(c, CURLOPT_HTTPHEADER, headers.get());
    curl_easy_setopt(c, CURLOPT_POST, 1L);
    curl_easy_setopt(c, CURLOPT_POSTFIELDS, post_body->data());
    curl_easy_setopt(c, CURLOPT_POSTFIELDSIZE_LARGE, static_cast<curl_off_t>(post_body->size()));
  }
  const CURLcode code = curl_easy_perform(c);
  if (code != CURLE_OK) {
    out.transport_error = error[0] ? fmt::format("{} ({})", error, curl_easy_strerror(code)) : curl_easy_strerror(code);
    return out;
  }
  curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &out.status);
  return out;
}

bool retried(const Exchange& e) {
  return !e.transport_error.empty() || e.status == 429 || e.status >= 500;
}

std::string excerpt(const std::string& text) {
  constexpr size_t kShown = 300;
  return text.size() <= kShown ? text : text.substr(0, kShown) + "...";
}

std::string failure_text(const Exchange& e) {
  if (!e.transport_error.empty()) return e.transport_error;
  return fmt::format("HTTP {}: {}", e.status, excerpt(e.body));
}

// An exchange retried while it fails in a retried way, with doubling
// back-off; the last failure, or a failure not retried, fails the run.
Exchange exchange_with_retries(const RewardOptions& o, const std::string& url, const std::string* post_body) {
  double backoff = o.backoff_s;
  for (int64_t attempt = 0;; ++attempt) {
    Exchange e = exchange(url, post_body, o.timeout_s);
    if (e.transport_error.empty() && e.status >= 200 && e.status < 300) return e;
    if (!retried(e)) fail("reward {}: {} answered {}", o.name, url, failure_text(e));
    if (attempt >= o.retries)
      fail("reward {}: {} failed after {} attempt(s) (deadline {} s each): {}", o.name, url, attempt + 1, o.timeout_s,
           failure_text(e));
    spdlog::warn("reward {}: {} failed ({}); retry {}/{} in {} s", o.name, url, failure_text(e), attempt + 1, o.retries,
                 backoff);
    std::this_thread::sleep_for(std::chrono::duration<double>(backoff));
    backoff *= 2;
  }
}

std::string base_url(const std::string& url) {
  std::string base = url;
  while (!base.empty() && base.back() == '/') base.pop_back();
  return base;
}

boost::json::object json_object(const RewardOptions& o, const std::string& url, const std::string& body) {
  boost::system::error_code ec;
  boost::json::value v = boost::json::parse(body, ec);
  // Python's json writes NaN and Infinity, which JSON does not have.
  if (ec && (body.find("NaN") != std::string::npos || body.find("Infinity") != std::string::npos))
    fail("reward {}: {} answered non-finite scores (NaN or Infinity): {}", o.name, url, excerpt(body));
  if (ec) fail("reward {}: {} answered a body that is not JSON ({}): {}", o.name, url, ec.message(), excerpt(body));
  if (!v.is_object()) fail("reward {}: {} answered JSON that is not an object: {}", o.name, url, excerpt(body));
  return std::move(v.as_object());
}

// The scores of a /score answer: one finite number per sample, for this request.
at::Tensor parse_scores(const RewardOptions& o, const std::string& url, const std::string& body, int64_t samples,
                        const std::string& request) {
  const boost::json::object answer = json_object(o, url, body);
  const boost::json::value* scores = answer.if_contains("scores");
  if (!scores) fail("reward {}: {} answered no \"scores\": {}", o.name, url, excerpt(body));
  if (!scores->is_array())
    fail("reward {}: {} answered \"scores\" that is not an array: {}", o.name, url, excerpt(body));
  const boost::json::array& values = scores->as_array();
  if (static_cast<int64_t>(values.size()) != samples)
    fail("reward {}: {} answered {} scores for {} samples", o.name, url, values.size(), samples);
  if (const boost::json::value* echoed = answer.if_contains("request"))
    if (!echoed->is_string() || echoed->as_string() != request)
      fail("reward {}: {} answered request {} to request {}", o.name, url, boost::json::serialize(*echoed), request);
  std::vector<float> out;
  for (size_t i = 0; i < values.size(); ++i) {
    if (!values[i].is_number())
      fail("reward {}: {} answered a score that is not a number at index {}: {}", o.name, url, i,
           boost::json::serialize(values[i]));
    const double value = values[i].to_number<double>();
    if (!std::isfinite(value) || !std::isfinite(static_cast<float>(value)))
      fail("reward {}: {} answered a non-finite score at index {}: {}", o.name, url, i, value);
    out.push_back(static_cast<float>(value));
  }
  return at::tensor(out, at::kFloat);
}

std::string prompts_json(const std::vector<std::string>& texts, int64_t first, int64_t count) {
  boost::json::array prompts;
  for (int64_t i = first; i < first + count; ++i) prompts.emplace_back(texts[static_cast<size_t>(i)]);
  return boost::json::serialize(prompts);
}

class HttpReward final : public Reward {
 public:
  explicit HttpReward(const RewardOptions& options) : o_(options), score_url_(base_url(options.url) + "/score") {
    check_reward_server(o_);
    if (o_.input == RewardInput::Images) decoder_.emplace(o_.decoder, o_.device, "reward " + o_.name);
  }
  std::string name() const override { return "http:" + o_.url; }
  bool asynchronous() const override { return true; }
  void begin_rollout(int64_t rollout_id) override { rollout_id_ = rollout_id; }

  at::Tensor score(const at::Tensor& final_latents, const at::Tensor& prompt_index,
                   const std::vector<std::string>& texts) override {
    return start(final_latents, prompt_index, texts).get();
  }

  // The bodies are built here, on the caller's thread and device (the
  // decoder runs there); only the exchanges run on the request thread.
  std::future<at::Tensor> start(const at::Tensor& final_latents, const at::Tensor& prompt_index,
                                const std::vector<std::string>& texts) override {
    const int64_t n = final_latents.size(0);
    if (prompt_index.numel() != n || static_cast<int64_t>(texts.size()) != n)
      fail("reward {}: {} samples but {} prompt indices and {} texts", o_.name, n, prompt_index.numel(), texts.size());
    const at::Tensor payload = o_.input == RewardInput::Images ? decoder_->decode(final_latents)
                                                               : final_latents.to(at::kCPU, at::kFloat).contiguous();
    const at::Tensor indices = prompt_index.to(at::kCPU, at::kLong).contiguous();
    const int64_t per_request = o_.batch_size > 0 ? o_.batch_size : n;
    std::vector<Request> requests;
    for (int64_t first = 0; first < n; first += per_request) {
      const int64_t count = std::min(per_request, n - first);
      const std::string id = std::to_string(next_request_++);
      const std::vector<uint8_t> bytes = io::serialize_safetensors(
          {{"prompt_index", indices.narrow(0, first, count)},
           {o_.input == RewardInput::Images ? "images" : "latents", payload.narrow(0, first, count)}},
          {{"prompts", prompts_json(texts, first, count)},
           {"family", o_.family},
           {"rollout", std::to_string(rollout_id_)},
           {"request", id}});
      requests.push_back({std::string(bytes.begin(), bytes.end()), count, id});
    }
    return std::async(std::launch::async, [o = o_, url = score_url_, requests = std::move(requests), n] {
      std::vector<at::Tensor> parts;
      for (const Request& r : requests) {
        const Exchange e = exchange_with_retries(o, url, &r.body);
        parts.push_back(parse_scores(o, url, e.body, r.samples, r.id));
      }
      return checked_rewards(at::cat(parts), n, "http:" + o.url);
    });
  }

 private:
  struct Request {
    std::string body;
    int64_t samples;
    std::string id;
  };

  RewardOptions o_;
  std::string score_url_;
  std::optional<Decoder> decoder_;
  int64_t rollout_id_ = 0;
  std::atomic<int64_t> next_request_{0};
};

}  // namespace

std::string check_reward_server(const RewardOptions& o) {
  init_curl_once();
  const std::string url = base_url(o.url) + "/health";
  const Exchange e = exchange_with_retries(o, url, nullptr);
  const boost::json::object health = json_object(o, url, e.body);
  const boost::json::value* protocol = health.if_contains("protocol");
  if (!protocol || !protocol->is_int64() || protocol->get_int64() != kProtocol)
    fail("reward {}: {} speaks protocol {}, ditrl speaks protocol {} (docs/rewards.md)", o.name, url,
         protocol ? boost::json::serialize(*protocol) : "(none)", kProtocol);
  const boost::json::value* status = health.if_contains("status");
  if (!status || !status->is_string() || status->as_string() != "ok")
    fail("reward {}: {} is not ready: status {}", o.name, url, status ? boost::json::serialize(*status) : "(none)");
  const boost::json::value* input = health.if_contains("input");
  const std::string wanted(name_of(kRewardInputNames, o.input));
  if (!input || !input->is_string() || input->as_string() != wanted)
    fail("reward {}: {} scores input {} but the deck's reward {} sends input = \"{}\"", o.name, url,
         input ? boost::json::serialize(*input) : "(none)", o.name, wanted);
  const boost::json::value* scorer = health.if_contains("scorer");
  return scorer && scorer->is_string() ? std::string(scorer->as_string()) : std::string("?");
}

std::unique_ptr<Reward> make_http_reward(const RewardOptions& options) {
  return std::make_unique<HttpReward>(options);
}

}  // namespace ditrl::rollout
