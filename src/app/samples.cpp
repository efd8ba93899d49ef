#include <ditrl/app/options.hpp>
#include <ditrl/app/samples.hpp>
#include <ditrl/clock.hpp>
#include <ditrl/error.hpp>
#include <ditrl/io/png.hpp>
#include <ditrl/io/text_file.hpp>
#include <ditrl/io/webp.hpp>
#include <ditrl/models/latent_preview.hpp>
#include <ditrl/rl/stable_hash.hpp>
#include <ditrl/rollout/sampler.hpp>

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <spdlog/spdlog.h>
#include <boost/json.hpp>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <sstream>

namespace ditrl::app {

namespace {

constexpr const char* kIndex = "index.jsonl";

// The K prompt indices: the first K of a seeded permutation of the dataset
// (cycled when K exceeds it), fixed for the whole run.
std::vector<int64_t> preview_prompts(int64_t dataset_size, int64_t count, int64_t seed) {
  at::Generator gen = at::detail::createCPUGenerator(rl::stable_hash("preview_prompts", seed));
  const at::Tensor order = at::randperm(dataset_size, gen, at::kLong);
  std::vector<int64_t> out;
  for (int64_t i = 0; i < count; ++i) out.push_back(order[i % dataset_size].item<int64_t>());
  return out;
}

// The lines of an earlier run's index up to `first_rollout` (a resumed run
// writes the later ones again).
std::vector<std::string> kept_index_lines(const std::string& path, int64_t first_rollout) {
  std::vector<std::string> out;
  if (first_rollout == 0 || !std::filesystem::exists(path)) return out;
  std::istringstream lines(io::read_text_file(path));
  for (std::string line; std::getline(lines, line);) {
    if (line.empty()) continue;
    boost::system::error_code ec;
    const boost::json::value v = boost::json::parse(line, ec);
    if (ec || !v.is_object() || !v.as_object().contains("rollout"))
      fail("{}: a line is not a sample index entry: {}", path, line);
    if (v.at("rollout").to_number<int64_t>() <= first_rollout) out.push_back(line);
  }
  return out;
}

// K pictures [h, w, 3] in a near-square grid, row by row.
at::Tensor image_grid(const std::vector<at::Tensor>& pictures) {
  const auto k = static_cast<int64_t>(pictures.size());
  const auto cols = static_cast<int64_t>(std::ceil(std::sqrt(static_cast<double>(k))));
  const int64_t rows = (k + cols - 1) / cols, h = pictures[0].size(0), w = pictures[0].size(1);
  at::Tensor grid = at::zeros({rows * h, cols * w, 3}, at::kByte);
  for (int64_t i = 0; i < k; ++i)
    grid.narrow(0, (i / cols) * h, h).narrow(1, (i % cols) * w, w).copy_(pictures[static_cast<size_t>(i)]);
  return grid;
}

}  // namespace

SampleWriter::SampleWriter(Run& run, int64_t first_rollout) : run_(run) {
  const config::Config& c = run.config;
  const models::LatentGrid grid = latent_grid(c);
  factors_ = models::latent_rgb_factors(*run.family);
  std::vector<int64_t> one = run.policy.latent_shape;
  one.insert(one.begin(), 1);
  const int64_t channels = models::latent_frames(*run.family, at::zeros(one), grid).size(2);
  if (!c.log.decoder.empty()) {
    // Only rank 0 makes pictures, so only its device holds the VAE.
    if (run.runtime->world().rank == 0) decoder_.emplace(c.log.decoder, run.params->device(), "log.decoder");
  } else if (static_cast<int64_t>(factors_.weights.size()) != channels)
    fail(
        "{}: log.samples_every = {} needs a latent preview of {}'s {}-channel latents, and no latent-to-RGB factors "
        "are published for that channel count ({}); give log.decoder (tools/export_decoder.py) or set "
        "log.samples_every = 0",
        c.source, c.log.samples_every, c.model.family, channels,
        factors_.weights.empty() ? "this preset's VAE has none" : fmt::format("they have {}", factors_.weights.size()));
  video_ = grid.frames > 1;
  prompts_ = preview_prompts(run.prompts->size(), c.log.samples, c.data.seed);
  // Every sample group runs the same number of forwards, as the sharded
  // weights' gathers need: K padded to whole micro-groups on every group.
  const int64_t groups = run.runtime->sequence().samples().size();
  per_rank_ = (c.log.samples + groups - 1) / groups;
  microgroup_ = std::min(per_rank_, sampler_options(c).microgroup);
  per_rank_ = (per_rank_ + microgroup_ - 1) / microgroup_ * microgroup_;
  dir_ = (std::filesystem::path(c.run.out_dir) / "samples").string();
  if (run.runtime->world().rank == 0) {
    std::filesystem::create_directories(dir_);
    index_ = kept_index_lines(dir_ + "/" + kIndex, first_rollout);
  }
  spdlog::info("[samples] {} preview sample(s) of prompts [{}] every {} rollout(s) -> {} ({})", c.log.samples,
               fmt::join(prompts_, ", "), c.log.samples_every, dir_,
               decoder_ ? "decoded by " + c.log.decoder : factors_.source);
}

bool SampleWriter::due(int64_t rollouts_done) const {
  return rollouts_done % run_.config.log.samples_every == 0 || rollouts_done == run_.config.train.num_rollouts;
}

void SampleWriter::write(int64_t rollouts_done) {
  const auto start = Clock::now();
  const config::Config& c = run_.config;
  dist::Communicator& comm = run_.runtime->sequence().samples();
  const c10::Device device = run_.params->device();
  const int64_t k = c.log.samples;

  rollout::SampleBatch batch;
  std::vector<int64_t> rows, ids;
  for (int64_t s = comm.rank() * per_rank_; s < (comm.rank() + 1) * per_rank_; ++s) {
    rows.push_back(prompts_[static_cast<size_t>(std::min(s, k - 1))]);  // padding repeats the last prompt
    ids.push_back(s);
    batch.seeds.push_back(rl::stable_hash("preview_noise", c.run.seed, s));
  }
  batch.cond = run_.prompts->fetch(rows).to(device);
  models::Cond negative;
  if (run_.policy.needs_negative) negative = run_.prompts->negative(per_rank_).to(device);
  batch.negative = run_.policy.needs_negative ? &negative : nullptr;
  batch.prompt_index = at::tensor(rows, at::kLong);
  batch.sample_index = at::tensor(ids, at::kLong);
  batch.latent_shape = run_.policy.latent_shape;
  batch.rollout_id = rollouts_done;

  rollout::SamplerOptions options = sampler_options(c);
  options.microgroup = microgroup_;
  options.device = device;
  rollout::Trajectories t;
  {
    const shard::KeepGathered keep(*run_.params, c.parallel.rollout_keep_gathered);
    run_.params->begin_step();
    // No SDE step: the deterministic ODE, so only the weights change a picture.
    t = rollout::sample(*run_.family, {run_.params.get(), nullptr, run_.ulysses.get()}, run_.collector->schedule(),
                        rl::StepSelection{}, batch, options);
  }
  std::vector<std::string> texts;
  for (int64_t row : rows) texts.push_back(run_.prompts->text(row));
  // The run's reward (several: their weighted sum), scored on all of the rank's samples at once.
  const at::Tensor rewards =
      run_.rewards->weighted_sum(run_.rewards->finish(t.final_latents, t.prompt_index, texts)).to(device, at::kFloat);

  const at::Tensor local = t.final_latents.to(at::kFloat).contiguous();
  at::Tensor all_latents = at::empty({comm.size() * local.numel()}, local.options());
  comm.all_gather(local.view({-1}), all_latents);
  at::Tensor all_rewards = at::empty({comm.size() * per_rank_}, rewards.options());
  comm.all_gather(rewards.contiguous(), all_rewards);
  if (run_.runtime->world().rank != 0) return;

  std::vector<int64_t> shape = run_.policy.latent_shape;
  shape.insert(shape.begin(), comm.size() * per_rank_);
  const at::Tensor finals = all_latents.view(shape).narrow(0, 0, k).cpu();
  const at::Tensor kept_rewards = all_rewards.narrow(0, 0, k).cpu();
  const std::string file = fmt::format("rollout-{:06d}.{}", rollouts_done, video_ ? "webp" : "png");
  const std::string line = index_line(rollouts_done, file, kept_rewards);
  const std::vector<at::Tensor> pictures = this->pictures(finals);  // each [F, h, w, 3]
  if (video_) {
    // A latent frame previews `temporal` video frames; a decoded frame is one.
    const double per_frame = decoder_ ? 1.0 : static_cast<double>(factors_.temporal);
    const int frame_ms = static_cast<int>(std::lround(1000.0 * per_frame / c.rollout.fps));
    io::write_animated_webp(dir_ + "/" + file, at::cat(pictures, 2), frame_ms);
  } else {
    std::vector<at::Tensor> images;
    for (const at::Tensor& p : pictures) images.push_back(p[0]);
    std::string caption;
    for (int64_t i = 0; i < k; ++i)
      caption += fmt::format("{}: {} (reward {:.4g})\n", i, run_.prompts->text(prompts_[static_cast<size_t>(i)]),
                             kept_rewards[i].item<float>());
    io::write_png(dir_ + "/" + file, image_grid(images),
                  {{"Title", fmt::format("{} after rollout {}", c.run.name, rollouts_done)},
                   {"Description", caption},
                   {"ditrl", line}});
  }
  // The index names a file only once the file is whole.
  index_.erase(std::remove_if(index_.begin(), index_.end(),
                              [&](const std::string& l) {
                                return boost::json::parse(l).at("rollout").to_number<int64_t>() == rollouts_done;
                              }),
               index_.end());
  index_.push_back(line);
  io::write_text_file(dir_ + "/" + kIndex, fmt::format("{}\n", fmt::join(index_, "\n")));
  spdlog::info("[samples] after rollout {}: {}/{} ({} samples, mean reward {:.4g}) in {:.2f} s", rollouts_done, dir_,
               file, k, kept_rewards.mean().item<double>(), seconds_since(start));
}

std::vector<at::Tensor> SampleWriter::pictures(const at::Tensor& finals) {
  std::vector<at::Tensor> out;
  if (decoder_) {
    const at::Tensor rgb = decoder_->decode(finals);  // [K, H, W, 3] or [K, F, H, W, 3]
    for (int64_t i = 0; i < rgb.size(0); ++i) out.push_back(rgb.dim() == 4 ? rgb[i].unsqueeze(0) : rgb[i]);
    return out;
  }
  const at::Tensor frames = models::latent_frames(*run_.family, finals, latent_grid(run_.config));  // [K, F, C, H, W]
  for (int64_t i = 0; i < frames.size(0); ++i) out.push_back(models::latent_preview(frames[i], factors_));
  return out;
}

std::string SampleWriter::index_line(int64_t rollouts_done, const std::string& file, const at::Tensor& rewards) const {
  boost::json::array prompts, indices, values;
  for (int64_t i = 0; i < run_.config.log.samples; ++i) {
    const int64_t p = prompts_[static_cast<size_t>(i)];
    prompts.emplace_back(run_.prompts->text(p));
    indices.emplace_back(p);
    values.emplace_back(static_cast<double>(rewards[i].item<float>()));
  }
  boost::json::object o;
  o["rollout"] = rollouts_done;
  o["file"] = file;
  o["prompts"] = std::move(prompts);
  o["prompt_index"] = std::move(indices);
  o["rewards"] = std::move(values);
  o["source"] = decoder_ ? "decoder" : "latent_preview";
  return boost::json::serialize(o);
}

std::unique_ptr<SampleWriter> open_sample_writer(Run& run, int64_t first_rollout) {
  if (run.config.log.samples_every == 0) return nullptr;
  return std::make_unique<SampleWriter>(run, first_rollout);
}

}  // namespace ditrl::app
