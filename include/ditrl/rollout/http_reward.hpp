#pragma once

// A reward server over HTTP/1.1 (libcurl), protocol version 1 as
// docs/rewards.md writes it down: GET /health says which input the server
// scores; POST /score takes one safetensors body (the samples' prompt
// indices and their final latents or decoded RGB images, the prompts and
// the family in its metadata) and answers {"scores": [...], "request": id}.
// Each request has a deadline; connection failures, deadlines and 5xx/429
// answers are retried with doubling back-off, then fail the run naming the
// reward, the URL, the status and the reason; every other wrong answer fails
// it at once. Requests run on their own threads, so a rollout's next
// micro-group samples while the server scores the last one.

#include <ditrl/rollout/reward.hpp>

#include <memory>
#include <string>

namespace ditrl::rollout {

// GET <url>/health, retried as requests are: refuses, naming the reward and
// the URL, a server that does not answer 200, speaks another protocol or
// scores another input than options.input. Returns the scorer it names.
std::string check_reward_server(const RewardOptions& options);

// Checks the server (check_reward_server) and, for input = images, loads the
// decoder onto options.device.
std::unique_ptr<Reward> make_http_reward(const RewardOptions& options);

}  // namespace ditrl::rollout
