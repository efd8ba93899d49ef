#include <ditrl/app/report.hpp>
#include <ditrl/io/text_file.hpp>

#include <fmt/format.h>
#include <boost/json.hpp>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <limits>
#include <sstream>

namespace ditrl::app {

namespace {

std::string escape(const std::string& text) {
  std::string out;
  for (const char c : text) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

double median(std::vector<double> v) {
  v.erase(std::remove_if(v.begin(), v.end(), [](double x) { return !std::isfinite(x); }), v.end());
  if (v.empty()) return std::numeric_limits<double>::quiet_NaN();
  std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(v.size() / 2), v.end());
  return v[v.size() / 2];
}

// One metric against the optimizer step as an inline SVG line.
std::string curve_svg(const std::string& name, const std::vector<int64_t>& steps, const std::vector<double>& values) {
  constexpr double kWidth = 360, kHeight = 150, kLeft = 8, kTop = 22, kPlotW = 344, kPlotH = 112;
  double lo = std::numeric_limits<double>::infinity(), hi = -lo, last = std::numeric_limits<double>::quiet_NaN();
  for (const double v : values)
    if (std::isfinite(v)) {
      lo = std::min(lo, v);
      hi = std::max(hi, v);
      last = v;
    }
  std::string points;
  if (std::isfinite(lo)) {
    const double x0 = static_cast<double>(steps.front()), xs = std::max<double>(1, steps.back() - steps.front());
    const double ys = hi > lo ? hi - lo : 1;
    for (size_t i = 0; i < steps.size(); ++i)
      if (std::isfinite(values[i]))
        points += fmt::format("{:.1f},{:.1f} ", kLeft + (static_cast<double>(steps[i]) - x0) / xs * kPlotW,
                              kTop + kPlotH - (values[i] - lo) / ys * kPlotH);
  }
  return fmt::format(
      "<figure class=\"curve\"><svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{0}\" height=\"{1}\" "
      "viewBox=\"0 0 {0} {1}\" role=\"img\" aria-label=\"{2}\"><text x=\"{3}\" y=\"14\">{2}</text>"
      "<rect x=\"{3}\" y=\"{4}\" width=\"{5}\" height=\"{6}\" fill=\"none\" stroke=\"#ccc\"/>"
      "<polyline fill=\"none\" stroke=\"#1f77b4\" stroke-width=\"1.5\" points=\"{7}\"/></svg>"
      "<figcaption>last {8:.6g}, min {9:.6g}, max {10:.6g}</figcaption></figure>\n",
      kWidth, kHeight, escape(name), kLeft, kTop, kPlotW, kPlotH, points, last, lo, hi);
}

std::string samples_section(const std::string& index) {
  std::string out;
  std::istringstream lines(index);
  for (std::string line; std::getline(lines, line);) {
    boost::system::error_code ec;
    const boost::json::value v = boost::json::parse(line, ec);
    if (ec || !v.is_object()) continue;
    const boost::json::object& o = v.as_object();
    double mean = 0;
    const boost::json::array& rewards = o.at("rewards").as_array();
    for (const auto& r : rewards) mean += r.to_number<double>();
    mean /= std::max<size_t>(1, rewards.size());
    std::string prompts;
    for (const auto& p : o.at("prompts").as_array()) prompts += escape(std::string(p.as_string())) + "; ";
    const std::string file(o.at("file").as_string());
    out += fmt::format(
        "<figure class=\"samples\"><img src=\"samples/{0}\" alt=\"samples after rollout {1}\" title=\"{3}\">"
        "<figcaption>rollout {1}, mean reward {2:.4g}</figcaption></figure>\n",
        escape(file), o.at("rollout").to_number<int64_t>(), mean, prompts);
  }
  return out.empty() ? "<p>No preview samples ([log] samples_every = 0).</p>\n" : out;
}

// Every image reports whether it loaded; a broken one is a console error.
constexpr const char* kImageCheck = R"(<script>
window.addEventListener('load', () => {
  const images = Array.from(document.images);
  const broken = images.filter((i) => !i.complete || i.naturalWidth === 0);
  document.body.dataset.images = String(images.length);
  document.body.dataset.broken = String(broken.length);
  broken.forEach((i) => console.error('image did not load: ' + i.getAttribute('src')));
});
</script>
)";

}  // namespace

RunReport::RunReport(std::string out_dir, ReportIdentity identity, const io::MetricsTable& earlier)
    : out_dir_(std::move(out_dir)), identity_(std::move(identity)), steps_(earlier.steps), series_(earlier.series) {}

void RunReport::add(const MetricRow& row) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  for (const auto& [key, value] : row.values)
    if (!series_.count(key)) series_[key] = std::vector<double>(steps_.size(), nan);
  steps_.push_back(row.step);
  for (auto& [key, values] : series_) {
    const auto it = row.values.find(key);
    values.push_back(it == row.values.end() ? nan : it->second);
  }
}

void RunReport::write(int64_t rollouts_done, int64_t job_rollouts, double seconds) const {
  const std::string index_path = out_dir_ + "/samples/index.jsonl";
  const std::string index = std::filesystem::exists(index_path) ? io::read_text_file(index_path) : "";
  io::write_text_file(out_dir_ + "/report.html",
                      report_html(identity_, steps_, series_, index, rollouts_done, job_rollouts, seconds));
}

std::string report_html(const ReportIdentity& id, const std::vector<int64_t>& steps,
                        const std::map<std::string, std::vector<double>>& series, const std::string& samples_index,
                        int64_t rollouts_done, int64_t job_rollouts, double seconds) {
  std::string curves, perf;
  for (const auto& [name, values] : series) {
    if (name.rfind("perf/", 0) == 0) {
      if (name.size() > 8 && name.compare(name.size() - 8, 8, "_seconds") == 0)
        perf += fmt::format("<tr><td>{}</td><td>{:.4g} s</td></tr>\n", escape(name), median(values));
    } else if (!steps.empty()) {
      curves += curve_svg(name, steps, values);
    }
  }
  const double per_hour = seconds > 0 ? static_cast<double>(job_rollouts) / seconds * 3600 : 0;
  return fmt::format(
      R"(<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>ditrl: {0}</title>
<style>
body {{ font-family: sans-serif; margin: 1.5em; }}
figure {{ display: inline-block; margin: 0.5em; vertical-align: top; }}
figure.samples img {{ image-rendering: pixelated; min-width: 128px; border: 1px solid #ccc; }}
td {{ padding: 0 1em 0 0; }}
pre {{ background: #f4f4f4; padding: 0.5em; max-height: 30em; overflow: auto; }}
</style></head>
<body>
<h1>{0}</h1>
<h2>Run</h2>
<table>
<tr><td>deck</td><td>{1}</td></tr>
<tr><td>commit</td><td>{2}</td></tr>
<tr><td>device</td><td>{3}, {4} rank(s), {5} thread(s) each</td></tr>
<tr><td>progress</td><td>rollout {6} of {7}, optimizer step {8}</td></tr>
</table>
<h2>Throughput</h2>
<table>
<tr><td>this job</td><td>{9} rollout(s) in {10:.1f} s: {11:.1f} rollouts/h</td></tr>
{12}</table>
<h2>Samples</h2>
{13}<h2>Curves</h2>
{14}<h2>Deck</h2>
<pre>{15}</pre>
{16}</body></html>
)",
      escape(id.name), escape(id.deck_path), escape(id.commit), escape(id.device), id.ranks, id.threads, rollouts_done,
      id.num_rollouts, steps.empty() ? 0 : steps.back() + 1, job_rollouts, seconds, per_hour, perf,
      samples_section(samples_index), curves, escape(id.deck_text), kImageCheck);
}

}  // namespace ditrl::app
