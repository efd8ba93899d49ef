// `ditrl align A.h5 B.h5`: pairs the tensors of side X of dump A with side Y
// of dump B by key and path (io/tensor_dump.hpp layout) and reports how many
// are bit-exact and how far the others are, relative to B
// (io/dump_alignment.hpp). A and B may be one file (rollout vs train of one
// run), two runs, or another engine's dump.

#include <ditrl/app/commands.hpp>
#include <ditrl/error.hpp>
#include <ditrl/io/dump_alignment.hpp>
#include <ditrl/io/tensor_dump.hpp>

#include <fmt/format.h>
#include <boost/json.hpp>

#include <cmath>
#include <filesystem>
#include <iostream>
#include <memory>

namespace ditrl::app {

namespace {

namespace json = boost::json;

struct AlignCli {
  std::string a, b;
  double threshold = 5e-2;
  std::string sides = "rollout,train";
  bool json = false;
};

std::pair<std::string, std::string> parse_sides(const std::string& text) {
  const size_t comma = text.find(',');
  if (comma == std::string::npos || comma == 0 || comma + 1 == text.size() ||
      text.find(',', comma + 1) != std::string::npos)
    fail("--sides '{}': expected SIDE_A,SIDE_B (e.g. rollout,train)", text);
  return {text.substr(0, comma), text.substr(comma + 1)};
}

io::h5::File open_dump(const std::string& path) {
  if (!std::filesystem::is_regular_file(path)) fail("{}: no such dump file", path);
  return io::h5::File::open(path);
}

struct Report {
  std::vector<io::AlignedPair> pairs;
  io::DumpPairing pairing;
  io::AlignmentSummary summary;
};

Report align(const AlignCli& cli, const std::string& side_a, const std::string& side_b) {
  const io::h5::File fa = open_dump(cli.a), fb = open_dump(cli.b);
  Report r;
  r.pairing = io::pair_dump_entries(io::list_tensor_dump(fa, side_a), io::list_tensor_dump(fb, side_b));
  for (const auto& [ea, eb] : r.pairing.pairs) {
    const at::Tensor ta = io::read_dumped_tensor(fa, side_a, ea);
    const at::Tensor tb = io::read_dumped_tensor(fb, side_b, eb);
    r.pairs.push_back({ea.key + "/" + ea.path, io::h5::dtype_name(ta.scalar_type()),
                       io::h5::dtype_name(tb.scalar_type()), io::compare_tensors(ta, tb)});
  }
  r.summary = io::summarize_alignment(r.pairs, cli.threshold);
  return r;
}

// JSON has no infinity: a non-finite error is the string "inf".
json::value rel_value(double rel) {
  return std::isfinite(rel) ? json::value(rel) : json::value("inf");
}

json::object pair_json(const io::AlignedPair& p) {
  return {{"name", p.name},
          {"rel", rel_value(p.comparison.rel)},
          {"bit_exact", p.comparison.bit_exact},
          {"dtype_a", p.dtype_a},
          {"dtype_b", p.dtype_b}};
}

void print_json(const AlignCli& cli, const std::string& side_a, const std::string& side_b, const Report& r) {
  const io::AlignmentSummary& s = r.summary;
  json::array worst, only_a, only_b;
  for (size_t i : s.worst) worst.push_back(pair_json(r.pairs[i]));
  for (const std::string& n : r.pairing.only_a) only_a.push_back(json::value(n));
  for (const std::string& n : r.pairing.only_b) only_b.push_back(json::value(n));
  const json::object out{
      {"a", {{"file", cli.a}, {"side", side_a}}},
      {"b", {{"file", cli.b}, {"side", side_b}}},
      {"threshold", cli.threshold},
      {"pairs", s.pairs},
      {"bit_exact", s.bit_exact},
      {"over_threshold", s.over_threshold},
      {"peak_rel", rel_value(s.peak)},
      {"median_rel", rel_value(s.median)},
      {"only_a", only_a},
      {"only_b", only_b},
      {"first_divergence", s.first_divergence ? json::value(pair_json(r.pairs[*s.first_divergence])) : nullptr},
      {"worst", worst}};
  std::cout << json::serialize(out) << "\n";
}

void print_names(const char* label, const std::vector<std::string>& names) {
  constexpr size_t kShown = 10;
  for (size_t i = 0; i < names.size() && i < kShown; ++i) std::cout << fmt::format("  {} {}\n", label, names[i]);
  if (names.size() > kShown) std::cout << fmt::format("  ... and {} more {}\n", names.size() - kShown, label);
}

std::string pair_line(const io::AlignedPair& p) {
  return fmt::format("  {:<10.3e} {:<9} {:>4}/{:<4}  {}", p.comparison.rel, p.comparison.bit_exact ? "yes" : "no",
                     p.dtype_a, p.dtype_b, p.name);
}

void print_table(const AlignCli& cli, const std::string& side_a, const std::string& side_b, const Report& r) {
  const io::AlignmentSummary& s = r.summary;
  const double percent = s.pairs ? 100.0 * static_cast<double>(s.bit_exact) / static_cast<double>(s.pairs) : 0.0;
  std::cout << fmt::format("A: {} /{}\nB: {} /{}   (rel = max|a-b| / max|b|)\n", cli.a, side_a, cli.b, side_b);
  std::cout << fmt::format("{:<22}{}\n", "pairs", s.pairs);
  std::cout << fmt::format("{:<22}{} ({:.2f}%)\n", "bit-exact", s.bit_exact, percent);
  std::cout << fmt::format("{:<22}{}\n", fmt::format("rel >= {:g}", cli.threshold), s.over_threshold);
  std::cout << fmt::format("{:<22}{:.3e}\n", "peak rel", s.peak);
  std::cout << fmt::format("{:<22}{:.3e}\n", "median rel", s.median);
  std::cout << fmt::format("{:<22}{} only in A, {} only in B\n", "unpaired", r.pairing.only_a.size(),
                           r.pairing.only_b.size());
  print_names("only in A:", r.pairing.only_a);
  print_names("only in B:", r.pairing.only_b);
  std::cout << fmt::format("{:<22}{}\n", "first divergence",
                           s.first_divergence ? r.pairs[*s.first_divergence].name : std::string("none"));
  if (s.first_divergence) std::cout << pair_line(r.pairs[*s.first_divergence]) << "\n";
  if (s.worst.empty()) return;
  std::cout << fmt::format("worst {}:\n  {:<10} {:<9} {:>9}  {}\n", s.worst.size(), "rel", "bit-exact", "dtype A/B",
                           "key/module/tensor");
  for (size_t i : s.worst) std::cout << pair_line(r.pairs[i]) << "\n";
}

int run_align(const AlignCli& cli) {
  const auto [side_a, side_b] = parse_sides(cli.sides);
  const Report r = align(cli, side_a, side_b);
  if (r.pairs.empty())
    fail("align: no tensor of {} /{} pairs with one of {} /{} ({} and {} unpaired names): nothing to compare", cli.a,
         side_a, cli.b, side_b, r.pairing.only_a.size(), r.pairing.only_b.size());
  if (cli.json)
    print_json(cli, side_a, side_b, r);
  else
    print_table(cli, side_a, side_b, r);
  return 0;
}

}  // namespace

void add_align_command(CLI::App& app, Command& selected) {
  auto cli = std::make_shared<AlignCli>();
  CLI::App* sub = app.add_subcommand(
      "align",
      "Compare two tensor dumps ([debug] dump = true, or another engine's) pair by pair, e.g. rollout vs train");
  sub->add_option("a", cli->a, "dump file A (HDF5, /<side>/<key>/<module>/<tensor>)")->required();
  sub->add_option("b", cli->b, "dump file B, the reference of the relative error (may be A)")->required();
  sub->add_option("--threshold", cli->threshold, "count pairs with rel >= this (default 5e-2)")
      ->check(CLI::NonNegativeNumber);
  sub->add_option("--sides", cli->sides, "side of A, side of B (default rollout,train)");
  sub->add_flag("--json", cli->json, "print the report as one JSON object");
  sub->callback([cli, &selected] { selected = [cli] { return run_align(*cli); }; });
}

}  // namespace ditrl::app
