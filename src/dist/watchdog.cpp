// The collective watchdog (see dist/watchdog.hpp).
//
// Side channel protocol, on a duplicate of the world communicator that only
// watchdog threads use: a timed-out rank sends kQuery to every peer; each
// peer's watchdog thread answers kReply with its state text:
//   C <channel> <entered> <left>          one line per channel
//   W <channel> <seq> <age_ms> <op>       one line per open scope
// A peer that does not answer within reply_wait_s is not responding (a
// stopped or dead process, or one whose MPI progress is gone).

#include <ditrl/clock.hpp>
#include <ditrl/dist/watchdog.hpp>
#include <ditrl/error.hpp>

#include <fmt/format.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <iostream>
#include <map>
#include <mutex>
#include <optional>
#include <sstream>
#include <thread>
#include <vector>

namespace ditrl::dist {

namespace {

constexpr int kQuery = 1;
constexpr int kReply = 2;

struct Open {
  std::string channel;
  std::string op;
  uint64_t seq = 0;  // this scope's number on its channel (1-based)
  Clock::time_point since;
  double limit_s = 0;
  const char* limit_key = "";
};

struct Counts {
  uint64_t entered = 0;
  uint64_t left = 0;
};

// This process's open scopes and per-channel counts: shared by every thread
// that runs collectives and the watchdog thread.
struct Registry {
  std::mutex mutex;
  std::map<uint64_t, Open> open;
  std::map<std::string, Counts> counts;
  uint64_t next_id = 1;
};

Registry& registry() {
  static Registry r;
  return r;
}

std::atomic<bool> g_running{false};
std::atomic<bool> g_started{false};
std::atomic<double> g_startup_timeout_s{300};
std::atomic<double> g_collective_timeout_s{100};

std::string state_text() {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  std::string text;
  for (const auto& [channel, c] : r.counts) text += fmt::format("C {} {} {}\n", channel, c.entered, c.left);
  for (const auto& [id, o] : r.open)
    text += fmt::format("W {} {} {} {}\n", o.channel, o.seq, static_cast<int64_t>(seconds_since(o.since) * 1000), o.op);
  return text;
}

// A peer's answer, parsed.
struct PeerState {
  std::map<std::string, Counts> counts;
  struct Waiting {
    std::string channel, op;
    uint64_t seq = 0;
    double age_s = 0;
  };
  std::vector<Waiting> waiting;
};

PeerState parse_state(const std::string& text) {
  PeerState state;
  std::istringstream lines(text);
  std::string line;
  while (std::getline(lines, line)) {
    std::istringstream in(line);
    std::string kind, channel;
    in >> kind >> channel;
    if (kind == "C") {
      Counts c;
      in >> c.entered >> c.left;
      state.counts[channel] = c;
    } else if (kind == "W") {
      PeerState::Waiting w;
      w.channel = channel;
      int64_t age_ms = 0;
      in >> w.seq >> age_ms;
      std::getline(in >> std::ws, w.op);
      w.age_s = age_ms / 1000.0;
      state.waiting.push_back(w);
    }
  }
  return state;
}

// What a peer that answered is doing about collective #seq on `channel`.
std::optional<std::string> why_missing(const PeerState& peer, const Open& stuck) {
  const auto it = peer.counts.find(stuck.channel);
  const uint64_t entered = it == peer.counts.end() ? 0 : it->second.entered;
  if (entered >= stuck.seq) return std::nullopt;  // it is in this collective too (or past it)
  std::string doing = "not in any collective (computing, or blocked outside ditrl's collectives)";
  if (!peer.waiting.empty()) {
    const PeerState::Waiting& w = peer.waiting.front();
    doing = fmt::format("waiting {:.1f} s in {} {} #{}", w.age_s, w.channel, w.op, w.seq);
  }
  return fmt::format("has not reached it (entered {} collectives on {}), {}", entered, stuck.channel, doing);
}

}  // namespace

class Watchdog::Impl {
 public:
  Impl(MPI_Comm world, const WatchdogOptions& options) : options_(options) {
    MPI_Comm_rank(world, &rank_);
    MPI_Comm_size(world, &size_);
    MPI_Comm_dup(world, &side_);
    MPI_Comm_set_errhandler(side_, MPI_ERRORS_RETURN);
    thread_ = std::thread([this] { loop(); });
  }

  ~Impl() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stop_ = true;
    }
    wake_.notify_one();
    thread_.join();
    // Local in Open MPI; a peer's unanswered query (only when it is about to
    // abort the job) is dropped with it.
    MPI_Comm_free(&side_);
  }

 private:
  void loop() {
    std::unique_lock<std::mutex> lock(mutex_);
    while (!stop_) {
      lock.unlock();
      answer_queries();
      if (std::optional<Open> stuck = expired()) abort_job(*stuck);
      lock.lock();
      wake_.wait_for(lock, std::chrono::duration<double>(options_.poll_s), [this] { return stop_; });
    }
  }

  void answer_queries() {
    while (true) {
      int pending = 0;
      MPI_Status status;
      if (MPI_Iprobe(MPI_ANY_SOURCE, kQuery, side_, &pending, &status) != MPI_SUCCESS || !pending) return;
      int asker = -1;
      MPI_Recv(&asker, 1, MPI_INT, status.MPI_SOURCE, kQuery, side_, MPI_STATUS_IGNORE);
      const std::string text = state_text();
      MPI_Send(text.data(), static_cast<int>(text.size()), MPI_CHAR, status.MPI_SOURCE, kReply, side_);
    }
  }

  // The oldest open scope past its limit, if any.
  static std::optional<Open> expired() {
    Registry& r = registry();
    std::lock_guard<std::mutex> lock(r.mutex);
    std::optional<Open> oldest;
    for (const auto& [id, o] : r.open)
      if (seconds_since(o.since) > o.limit_s && (!oldest || o.since < oldest->since)) oldest = o;
    return oldest;
  }

  std::map<int, std::string> ask_peers() {
    std::vector<MPI_Request> sends;
    for (int peer = 0; peer < size_; ++peer) {
      if (peer == rank_) continue;
      MPI_Request request = MPI_REQUEST_NULL;
      if (MPI_Isend(&rank_, 1, MPI_INT, peer, kQuery, side_, &request) == MPI_SUCCESS) sends.push_back(request);
    }
    std::map<int, std::string> replies;
    const Clock::time_point deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                                          std::chrono::duration<double>(options_.reply_wait_s));
    while (static_cast<int>(replies.size()) < size_ - 1 && Clock::now() < deadline) {
      answer_queries();  // a peer that timed out at the same moment asks us too
      int pending = 0;
      MPI_Status status;
      if (MPI_Iprobe(MPI_ANY_SOURCE, kReply, side_, &pending, &status) == MPI_SUCCESS && pending) {
        int bytes = 0;
        MPI_Get_count(&status, MPI_CHAR, &bytes);
        std::string text(static_cast<size_t>(bytes), '\0');
        MPI_Recv(text.data(), bytes, MPI_CHAR, status.MPI_SOURCE, kReply, side_, MPI_STATUS_IGNORE);
        replies[status.MPI_SOURCE] = text;
      } else {
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
      }
    }
    // A send to a stopped peer may never complete; the job ends anyway.
    for (MPI_Request& request : sends) MPI_Request_free(&request);
    return replies;
  }

  [[noreturn]] void abort_job(const Open& stuck) {
    const std::map<int, std::string> replies = ask_peers();
    std::vector<std::string> missing;
    for (int peer = 0; peer < size_; ++peer) {
      if (peer == rank_) continue;
      const auto reply = replies.find(peer);
      if (reply == replies.end()) {
        missing.push_back(
            fmt::format("rank {} (not responding within {:g} s: stopped, hung or dead)", peer, options_.reply_wait_s));
      } else if (auto why = why_missing(parse_state(reply->second), stuck)) {
        missing.push_back(fmt::format("rank {} ({})", peer, *why));
      }
    }
    std::string who;
    for (const std::string& m : missing) who += (who.empty() ? "" : "; ") + m;
    const std::string message = fmt::format(
        "collective timeout on rank {}: waited {:.1f} s in {} {} #{} (limit {:g} s, [parallel] {}); missing: {}; "
        "aborting the job",
        rank_, seconds_since(stuck.since), stuck.channel, stuck.op, stuck.seq, stuck.limit_s, stuck.limit_key,
        who.empty() ? "none (every rank is in this collective: an MPI or network fault)" : who);
    std::cerr << "ditrl: " << message << std::endl;
    if (auto logger = spdlog::default_logger()) {
      logger->error(message);
      logger->flush();
    }
    // MPI_Abort can itself hang when the launcher is gone: exit regardless.
    std::thread([code = options_.exit_code] {
      std::this_thread::sleep_for(std::chrono::seconds(10));
      _exit(code);
    }).detach();
    MPI_Abort(MPI_COMM_WORLD, options_.exit_code);
    _exit(options_.exit_code);
  }

  WatchdogOptions options_;
  int rank_ = 0;
  int size_ = 1;
  MPI_Comm side_ = MPI_COMM_NULL;
  std::mutex mutex_;
  std::condition_variable wake_;
  bool stop_ = false;
  std::thread thread_;
};

Watchdog::Watchdog(MPI_Comm world, const WatchdogOptions& options) {
  int size = 1, provided = MPI_THREAD_SINGLE;
  MPI_Comm_size(world, &size);
  MPI_Query_thread(&provided);
  if (size < 2) return;
  if (provided < MPI_THREAD_MULTIPLE) {
    spdlog::warn(
        "MPI provides thread level {} < MPI_THREAD_MULTIPLE: no collective watchdog (a stuck collective "
        "is not detected)",
        provided);
    return;
  }
  if (g_running.exchange(true)) fail("a collective watchdog is already running in this process");
  g_startup_timeout_s = options.startup_timeout_s;
  g_collective_timeout_s = options.collective_timeout_s;
  g_started = false;
  {
    std::lock_guard<std::mutex> lock(registry().mutex);
    registry().counts.clear();
  }
  impl_ = std::make_unique<Impl>(world, options);
}

Watchdog::~Watchdog() {
  if (!impl_) return;
  impl_.reset();
  g_running = false;
}

void Watchdog::mark_started() {
  g_started = true;
}

bool Watchdog::running() {
  return g_running.load();
}

struct ExitDeadline::State {
  std::mutex mutex;
  std::condition_variable wake;
  bool disarmed = false;
};

ExitDeadline::ExitDeadline(double seconds, std::string message) : state_(std::make_shared<State>()) {
  std::thread([state = state_, seconds, message = std::move(message)] {
    std::unique_lock<std::mutex> lock(state->mutex);
    if (state->wake.wait_for(lock, std::chrono::duration<double>(seconds), [&] { return state->disarmed; })) return;
    std::cerr << "ditrl: " << message << std::endl;
    _exit(124);
  }).detach();
}

ExitDeadline::~ExitDeadline() {
  disarm();
}

void ExitDeadline::disarm() {
  {
    std::lock_guard<std::mutex> lock(state_->mutex);
    state_->disarmed = true;
  }
  state_->wake.notify_one();
}

WaitScope::WaitScope(const std::string& channel, const std::string& op, bool active) {
  if (!active || !g_running.load(std::memory_order_relaxed)) return;
  Registry& r = registry();
  const bool started = g_started.load();
  std::lock_guard<std::mutex> lock(r.mutex);
  Open o;
  o.channel = channel;
  o.op = op;
  o.seq = ++r.counts[channel].entered;
  o.since = Clock::now();
  o.limit_s = started ? g_collective_timeout_s.load() : g_startup_timeout_s.load();
  o.limit_key = started ? "collective_timeout_s" : "startup_timeout_s";
  id_ = r.next_id++;
  r.open.emplace(id_, std::move(o));
}

WaitScope::~WaitScope() {
  if (id_ == 0) return;
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  const auto it = r.open.find(id_);
  if (it == r.open.end()) return;
  ++r.counts[it->second.channel].left;
  r.open.erase(it);
}

}  // namespace ditrl::dist
