// One report of every check, gathered on rank 0.

#include <ditrl/app/preflight/report.hpp>

#include <fmt/format.h>
#include <boost/json.hpp>

#include <algorithm>
#include <utility>

namespace ditrl::app::preflight {

namespace {

// Every rank's string on rank 0 (empty elsewhere).
std::vector<std::string> gather_text(const std::string& mine, MPI_Comm comm) {
  int rank = 0, size = 1;
  MPI_Comm_rank(comm, &rank);
  MPI_Comm_size(comm, &size);
  const int length = static_cast<int>(mine.size());
  std::vector<int> lengths(static_cast<size_t>(size)), offsets(static_cast<size_t>(size));
  MPI_Gather(&length, 1, MPI_INT, lengths.data(), 1, MPI_INT, 0, comm);
  int total = 0;
  for (int r = 0; r < size; ++r) offsets[static_cast<size_t>(r)] = std::exchange(total, total + lengths[r]);
  std::string all(static_cast<size_t>(rank == 0 ? total : 0), '\0');
  MPI_Gatherv(mine.data(), length, MPI_CHAR, all.data(), lengths.data(), offsets.data(), MPI_CHAR, 0, comm);
  std::vector<std::string> out;
  if (rank == 0)
    for (int r = 0; r < size; ++r) out.push_back(all.substr(static_cast<size_t>(offsets[r]), lengths[r]));
  return out;
}

}  // namespace

double max_over_ranks(double value, MPI_Comm comm) {
  double out = value;
  MPI_Allreduce(&value, &out, 1, MPI_DOUBLE, MPI_MAX, comm);
  return out;
}

Report::Report(const dist::WorldInfo& world, MPI_Comm comm) : world_(world), comm_(comm) {
  hosts_ = gather_text(world.host, comm);
}

void Report::add(const std::string& name, const Local& mine, const std::string& summary) {
  const std::vector<std::string> all = gather_text((mine.passed ? "P" : "F") + mine.text, comm_);
  if (world_.rank != 0) return;
  Check check{name, "PASS", summary, {}, {}};
  for (size_t r = 0; r < all.size(); ++r) {
    const std::string line = fmt::format("rank {} ({}): {}", r, hosts_[r], all[r].substr(1));
    if (all[r][0] == 'F') check.failures.push_back(line);
    check.ranks.push_back(line);
  }
  if (!check.failures.empty()) check.status = "FAIL";
  checks_.push_back(std::move(check));
}

void Report::skip(const std::string& name, const std::string& reason) {
  if (world_.rank == 0) checks_.push_back(Check{name, "SKIPPED", reason, {}, {}});
}

bool Report::failed() const {
  int mine = std::any_of(checks_.begin(), checks_.end(), [](const Check& c) { return c.status == "FAIL"; });
  int any = mine;
  MPI_Allreduce(&mine, &any, 1, MPI_INT, MPI_MAX, comm_);
  return any != 0;
}

std::string Report::text() const {
  std::string out = fmt::format("# ditrl preflight: {} rank(s)\n", world_.size);
  for (const Check& c : checks_) {
    out += fmt::format("{:<8} {:<32} {}\n", c.status, c.name, c.summary);
    for (const std::string& f : c.failures) out += "         FAILED on " + f + "\n";
    // Where each rank runs, its memory and its disk: the lines a user compares across ranks.
    if (c.failures.empty() && (c.name == "placement" || c.name.rfind("disk", 0) == 0 || c.name.rfind("memory", 0) == 0))
      for (const std::string& r : c.ranks) out += "         " + r + "\n";
  }
  int failed = 0;
  for (const Check& c : checks_) failed += c.status == "FAIL";
  out += failed ? fmt::format("preflight: {} check(s) FAILED\n", failed) : "preflight: every check passed\n";
  return out;
}

std::string Report::json() const {
  boost::json::array checks;
  bool passed = true;
  for (const Check& c : checks_) {
    boost::json::array failures(c.failures.begin(), c.failures.end()), ranks(c.ranks.begin(), c.ranks.end());
    checks.push_back(boost::json::object{
        {"name", c.name}, {"status", c.status}, {"summary", c.summary}, {"failures", failures}, {"ranks", ranks}});
    passed = passed && c.status != "FAIL";
  }
  boost::json::array hosts(hosts_.begin(), hosts_.end());
  return boost::json::serialize(
             boost::json::object{{"ranks", world_.size}, {"hosts", hosts}, {"passed", passed}, {"checks", checks}}) +
         "\n";
}

}  // namespace ditrl::app::preflight
