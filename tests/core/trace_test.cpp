#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include <map>
#include <sstream>
#include <vector>

#include "support/models.hpp"

namespace {

// One step of a 6-layer chain under `p`, traced; returns the trace's JSON, the trace's own
// figures and the allocator's peak over the step.
struct TraceRun {
  nlohmann::json json;
  std::vector<remat::TraceEvent> events;
  std::size_t trace_peak = 0;
  std::size_t counted_peak = 0;
  std::size_t replayed_nodes = 0;
  std::size_t recorded_ops = 0;
};

TraceRun traced_step(remat::test::ChainModel& model, const remat::plan::Plan& p) {
  using namespace remat;
  Rng rng(3);
  const Tensor<float> x = rng.normal_tensor<float>({16, 32});
  const auto targets = remat::test::targets(16, 32, 4);
  TraceRun run;
  memory::reset_peak();
  {
    Trace trace;
    {
      Tape tape;
      const Var<float> loss =
          cross_entropy(checkpoint_sequential(model.layers, p, tape.input(x)), targets);
      tape.backward(loss);
      run.replayed_nodes = tape.replay_stats().replayed_nodes;
      for (std::uint32_t i = 0; i < tape.size(); ++i)
        run.recorded_ops += remat::detail::TapeAccess::state(tape).node(i).is_leaf() ? 0 : 1;
    }
    run.counted_peak = memory::peak_bytes();
    std::ostringstream out;
    trace.write_chrome_json(out);
    run.json = nlohmann::json::parse(out.str());
    run.events = trace.events();
    run.trace_peak = trace.peak_bytes();
  }
  return run;
}

}  // namespace

TEST_CASE("trace: every op of forward, replay and backward, with matching begin/end events",
          "[trace]") {
  remat::test::ChainModel model(6, 32, "tanh", 1);
  const remat::plan::Chain chain = remat::plan::Chain::uniform(6, 1, 1);
  for (const remat::plan::Plan& p :
       {remat::plan::none(chain), remat::plan::every(chain), remat::plan::sqrt(chain)}) {
    INFO(p.describe());
    const TraceRun run = traced_step(model, p);

    std::map<std::string, std::size_t> by_phase;
    for (const auto& e : run.events) ++by_phase[remat::trace_phase_name(e.phase)];
    CHECK(by_phase["forward"] == run.recorded_ops);
    CHECK(by_phase["replay"] == run.replayed_nodes);
    CHECK(by_phase["segment"] == 2 * p.segment_count());  // once in forward, once replayed
    CHECK(by_phase["backward"] > 0);

    // Per lane, begin/end events pair up like brackets, with the same name, in time order.
    std::map<int, std::vector<std::string>> open;
    std::map<int, double> last_ts;
    std::size_t begins = 0, ends = 0, peaks = 0;
    std::size_t counter_max = 0, instant_peak = 0;
    for (const auto& e : run.json.at("traceEvents")) {
      const std::string ph = e.at("ph");
      if (ph == "M") continue;
      const double ts = e.at("ts");
      if (ph == "C") {
        counter_max = std::max<std::size_t>(counter_max, e.at("args").at("live"));
        continue;
      }
      if (ph == "i") {
        ++peaks;
        instant_peak = e.at("args").at("peak_bytes");
        continue;
      }
      const int tid = e.at("tid");
      CHECK(ts >= last_ts[tid]);
      last_ts[tid] = ts;
      if (ph == "B") {
        ++begins;
        open[tid].push_back(e.at("name"));
      } else {
        REQUIRE(ph == "E");
        ++ends;
        REQUIRE_FALSE(open[tid].empty());
        CHECK(open[tid].back() == e.at("name").get<std::string>());
        open[tid].pop_back();
      }
    }
    CHECK(begins == run.events.size());
    CHECK(ends == run.events.size());
    for (const auto& [tid, stack] : open) CHECK(stack.empty());
    // The peak the trace reports is the allocator's peak over the step, and no live-bytes
    // sample exceeds it.
    CHECK(peaks == 1);
    CHECK(instant_peak == run.counted_peak);
    CHECK(run.trace_peak == run.counted_peak);
    CHECK(counter_max <= run.counted_peak);
  }
}

TEST_CASE("trace: the process peak is the same with and without a trace", "[trace]") {
  using namespace remat;
  test::ChainModel model(8, 32, "gelu", 2);
  const plan::Chain chain = plan::Chain::uniform(8, 1, 1);
  const plan::Plan p = plan::sqrt(chain);
  Rng rng(5);
  const Tensor<float> x = rng.normal_tensor<float>({16, 32});
  const auto targets = test::targets(16, 32, 6);
  const auto peak_of_step = [&](bool traced) {
    std::optional<Trace> trace;
    memory::Probe probe;
    if (traced) trace.emplace();
    Tape tape;
    tape.backward(cross_entropy(checkpoint_sequential(model.layers, p, tape.input(x)), targets));
    return probe.peak_above_start();
  };
  peak_of_step(
      false);  // the first step allocates the parameters' gradient buffers; later ones reuse them
  const std::size_t plain = peak_of_step(false);
  CHECK(peak_of_step(true) == plain);
  CHECK(peak_of_step(false) == plain);
}

TEST_CASE("trace: traces do not nest, and op names are escaped in the JSON", "[trace]") {
  remat::Trace outer;
  CHECK_THROWS_AS(remat::Trace(), remat::UsageError);
  std::ostringstream out;
  remat::detail::write_json_string(out, std::string("a\"b\\c\n\x01"));
  CHECK(out.str() == "\"a\\\"b\\\\c\\u000a\\u0001\"");
}
