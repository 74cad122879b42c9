#include "support/gradcheck.hpp"

#include <remat/nn/gpt.hpp>
#include <remat/nn/lora.hpp>
#include <remat/optim/adamw.hpp>
#include <remat/optim/sgd.hpp>
#include <remat/train/parameters.hpp>
#include <remat/train/training_state.hpp>

#include <filesystem>
#include <functional>
#include <memory>
#include <tuple>

namespace {

namespace fs = std::filesystem;
using remat::IoError;
using remat::test::error_message;

std::string ts_path(const std::string& name) {
  const fs::path dir =
      fs::temp_directory_path() / ("remat_train_test_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  return (dir / name).string();
}

remat::nn::GPTConfig ts_config(std::uint64_t seed, std::int64_t layers = 1) {
  return {.vocab = 7, .context = 4, .layers = layers, .heads = 1, .width = 4, .seed = seed};
}

/// One training step on batch `step` (each step sees other data).
void ts_step(remat::nn::GPT<float>& gpt, remat::optim::Optimizer<float>& opt, int step) {
  const auto ids = remat::test::ids({2, 4}, 7, 100 + static_cast<std::uint64_t>(step));
  {
    remat::Tape tape;
    tape.backward(gpt.loss(ids, ids));
  }
  opt.step();
  opt.zero_grad();
}

std::vector<std::vector<float>> ts_values(const remat::nn::GPT<float>& gpt) {
  std::vector<std::vector<float>> out;
  for (const auto& p : gpt.parameters()) out.push_back(p.value().to_vector());
  return out;
}

using MakeOptimizer =
    std::function<std::unique_ptr<remat::optim::Optimizer<float>>(remat::nn::GPT<float>&)>;

}  // namespace

TEST_CASE("a resumed run takes bitwise the steps the uninterrupted run takes, for every optimizer",
          "[train][io]") {
  // For each optimizer set-up, and for a save after 0, 1 and 3 steps: run A trains straight
  // through; run B saves, a fresh model (other initial weights) and optimizer load the file, and
  // every later step must give the same parameters bit for bit.
  const std::vector<std::pair<std::string, MakeOptimizer>> setups = {
      {"SGD with momentum and weight decay",
       [](auto& g) {
         return std::make_unique<remat::optim::SGD<float>>(
             g.parameters(),
             remat::optim::SGDOptions{.lr = 0.05, .momentum = 0.9, .weight_decay = 0.01});
       }},
      {"SGD without momentum",
       [](auto& g) {
         return std::make_unique<remat::optim::SGD<float>>(g.parameters(),
                                                           remat::optim::SGDOptions{.lr = 0.05});
       }},
      {"AdamW",
       [](auto& g) {
         return std::make_unique<remat::optim::AdamW<float>>(
             g.parameters(), remat::optim::AdamWOptions{.lr = 0.01});
       }},
  };
  for (const auto& [label, make] : setups) {
    for (const int before : {0, 1, 3}) {
      for (const bool freeze_some : {false, true}) {  // frozen parameters have no optimizer buffers
        INFO(label << ", saved after " << before << " steps"
                   << (freeze_some ? ", position embedding frozen" : ""));
        remat::nn::GPT<float> a(ts_config(1)), b(ts_config(2));
        if (freeze_some) a.freeze("wpe"), b.freeze("wpe");
        auto oa = make(a);
        for (int s = 0; s < before; ++s) ts_step(a, *oa, s);
        const std::string path = ts_path("resume.safetensors");
        remat::train::save_training_state(path, a, *oa, {{"data.cursor", std::to_string(before)}});
        auto ob = make(b);
        ob->set_lr(123.0);  // the file restores the learning rate too
        CHECK(remat::train::load_training_state(path, b, *ob).at("data.cursor") ==
              std::to_string(before));
        CHECK(ob->steps() == before);
        CHECK(ob->lr() == oa->lr());
        CHECK(ts_values(b) == ts_values(a));
        for (int s = before; s < before + 3; ++s) {
          ts_step(a, *oa, s);
          ts_step(b, *ob, s);
          CHECK(ts_values(b) == ts_values(a));
        }
      }
    }
  }
}

TEST_CASE("LoRA adapters resume bitwise from their own training state, without the base",
          "[train][io][lora]") {
  // run A trains adapters over a frozen base straight through; run B's adapters (other initial
  // values) load A's state after 2 steps and must then take the same steps bit for bit
  remat::nn::GPT<float> a(ts_config(1, 2)), b(ts_config(1, 2));
  auto la = remat::nn::lora::apply(a, {.rank = 2, .alpha = 4, .targets = {"fc"}, .seed = 3});
  auto lb = remat::nn::lora::apply(b, {.rank = 2, .alpha = 4, .targets = {"fc"}, .seed = 4});
  remat::optim::AdamW<float> oa(la.parameters(), {.lr = 0.01, .weight_decay = 0});
  remat::optim::AdamW<float> ob(lb.parameters(), {.lr = 0.01, .weight_decay = 0});
  const auto adapter_values = [](const remat::nn::lora::Adapters<float>& l) {
    std::vector<std::vector<float>> out;
    for (const auto& p : l.parameters()) out.push_back(p.value().to_vector());
    return out;
  };
  for (int s = 0; s < 2; ++s) ts_step(a, oa, s);
  const std::string path = ts_path("lora.safetensors");
  remat::train::save_training_state(path, la, oa);
  const remat::io::File file = remat::io::File::read(path);
  CHECK_FALSE(file.contains("model.wte.weight"));  // the frozen base is not saved
  CHECK(file.contains("model." + la.named_parameters().front().first));
  CHECK(adapter_values(lb) != adapter_values(la));
  remat::train::load_training_state(path, lb, ob);
  CHECK(ob.steps() == 2);
  CHECK(adapter_values(lb) == adapter_values(la));
  for (int s = 2; s < 5; ++s) {
    ts_step(a, oa, s);
    ts_step(b, ob, s);
    CHECK(adapter_values(lb) == adapter_values(la));
    CHECK(ts_values(b) == ts_values(a));
  }
}

TEST_CASE("loading a training state is all or nothing, and names what does not fit",
          "[train][io][errors]") {
  remat::nn::GPT<float> a(ts_config(1));
  remat::optim::SGD<float> sgd(a.parameters(), {.lr = 0.1, .momentum = 0.9});
  ts_step(a, sgd, 0);
  const std::string path = ts_path("sgd_state.safetensors");
  remat::train::save_training_state(path, a, sgd);

  remat::nn::GPT<float> b(ts_config(3));
  const auto before = ts_values(b);
  remat::optim::AdamW<float> adamw(b.parameters());
  CHECK_THAT(error_message([&] { remat::train::load_training_state(path, b, adamw); }),
             Catch::Contains("holds the state of 'SGD', not of AdamW") &&
                 Catch::Contains("nothing was loaded"));
  remat::optim::SGD<float> plain(b.parameters(), {.lr = 0.1});
  CHECK_THAT(error_message([&] { remat::train::load_training_state(path, b, plain); }),
             Catch::Contains("the state has a velocity, but this SGD has no momentum") &&
                 Catch::Contains("nothing was loaded"));
  remat::nn::GPT<float> deeper(ts_config(3, 2));
  remat::optim::SGD<float> deeper_sgd(deeper.parameters(), {.lr = 0.1, .momentum = 0.9});
  CHECK_THAT(error_message([&] { remat::train::load_training_state(path, deeper, deeper_sgd); }),
             Catch::Contains("missing: model.blocks.1."));
  CHECK(ts_values(b) == before);  // nothing changed by any of the refusals

  // the state's own metadata cannot be overwritten by the caller's
  CHECK_THAT(error_message([&] {
               remat::train::save_training_state(path, a, sgd, {{"sgd.steps", "9"}});
             }),
             Catch::Contains("'sgd.steps' is taken by the training state"));
  // a file of parameters only is not a training state
  const std::string params = ts_path("params_only.safetensors");
  remat::train::save_parameters(params, a);
  remat::optim::SGD<float> b_sgd(b.parameters(), {.lr = 0.1, .momentum = 0.9});
  CHECK_THAT(error_message([&] { remat::train::load_training_state(params, b, b_sgd); }),
             Catch::Contains("holds the state of no optimizer"));
  // an optimizer over other parameters than the model's
  CHECK_THAT(
      error_message([&] { remat::train::load_training_state(path, b, sgd); }),
      Catch::Contains(
          "parameter 'wte.weight' of the model is not among the SGD optimizer's parameters"));
  // damaged counts and step numbers
  for (const auto& [key, value] :
       std::vector<std::pair<std::string, std::string>>{{"adamw.steps", "-1"},
                                                        {"adamw.steps", "x"},
                                                        {"adamw.steps", "1e3"},
                                                        {"adamw.lr", "nan"},
                                                        {"adamw.updates.wte.weight", "0"}}) {
    remat::nn::GPT<float> c(ts_config(1));
    remat::optim::AdamW<float> oc(c.parameters());
    ts_step(c, oc, 0);
    remat::train::save_training_state(path, c, oc);
    remat::io::File file = remat::io::File::read(path);
    remat::io::Metadata metadata = file.metadata();
    metadata[key] = value;
    std::vector<remat::io::NamedTensor<float>> tensors;
    for (const auto& [name, e] : file.entries())
      tensors.emplace_back(name, file.tensor<float>(name));
    remat::io::save(path, tensors, metadata);
    remat::nn::GPT<float> d(ts_config(4));
    const auto d_before = ts_values(d);
    remat::optim::AdamW<float> od(d.parameters());
    INFO(key << " = " << value);
    CHECK_THROWS_AS(remat::train::load_training_state(path, d, od), IoError);
    CHECK(ts_values(d) == d_before);
    CHECK(od.steps() == 0);
  }
}

TEST_CASE("loading parameters is all or nothing: missing, unexpected and wrong shapes are named",
          "[train][io][errors]") {
  const remat::nn::GPTConfig c{
      .vocab = 7, .context = 4, .layers = 2, .heads = 1, .width = 4, .seed = 1};
  remat::nn::GPT<float> a(c);
  const std::string path = ts_path("gpt.safetensors");
  remat::train::save_parameters(path, a, {{"note", "hello"}});
  remat::nn::GPT<float> b(remat::nn::GPTConfig{
      .vocab = 7, .context = 4, .layers = 2, .heads = 1, .width = 4, .seed = 2});
  CHECK(remat::train::load_parameters(path, b).at("note") == "hello");
  CHECK(ts_values(b) == ts_values(a));

  remat::nn::GPT<float> deeper(remat::nn::GPTConfig{
      .vocab = 7, .context = 4, .layers = 3, .heads = 1, .width = 4, .seed = 3});
  const auto before = ts_values(deeper);
  CHECK_THAT(error_message([&] { remat::train::load_parameters(path, deeper); }),
             Catch::Contains("missing: blocks.2.") && Catch::Contains("nothing was loaded"));
  CHECK(ts_values(deeper) == before);  // untouched
  remat::nn::GPT<float> shallower(remat::nn::GPTConfig{
      .vocab = 7, .context = 4, .layers = 1, .heads = 1, .width = 4, .seed = 3});
  CHECK_THAT(error_message([&] { remat::train::load_parameters(path, shallower); }),
             Catch::Contains("unexpected: blocks.1."));
  remat::nn::GPT<float> wider(remat::nn::GPTConfig{
      .vocab = 9, .context = 4, .layers = 2, .heads = 1, .width = 4, .seed = 3});
  CHECK_THAT(error_message([&] { remat::train::load_parameters(path, wider); }),
             Catch::Contains("wte.weight (file: F32 (7, 4), model: F32 (9, 4))"));
  remat::nn::GPT<double> doubled(c);
  CHECK_THAT(error_message([&] { remat::train::load_parameters(path, doubled); }),
             Catch::Contains("model: F64"));
}

TEST_CASE("a training state's learning rate, steps and counters are validated by name",
          "[train][io][errors]") {
  // lr = inf would train on silently and blow every weight up at the next step
  const std::string path = ts_path("damaged_numbers.safetensors");
  const std::vector<std::tuple<std::string, std::string, bool>> cases = {
      {"adamw.lr", "inf", false},      {"adamw.lr", "-inf", false},
      {"adamw.lr", "infinity", false}, {"adamw.lr", "nan", false},
      {"adamw.lr", "-0.5", false},     {"adamw.lr", "-1e-300", false},
      {"adamw.steps", "-1", false},    {"adamw.updates.wte.weight", "-3", false},
      {"adamw.lr", "0", true},         {"adamw.lr", "1e-300", true},
      {"adamw.lr", "3.5", true},       {"adamw.steps", "7", true}};
  for (const auto& [key, value, valid] : cases) {
    remat::nn::GPT<float> c(ts_config(1));
    remat::optim::AdamW<float> oc(c.parameters());
    ts_step(c, oc, 0);
    remat::train::save_training_state(path, c, oc);
    const remat::io::File file = remat::io::File::read(path);
    remat::io::Metadata metadata = file.metadata();
    metadata[key] = value;
    std::vector<remat::io::NamedTensor<float>> tensors;
    for (const auto& [name, e] : file.entries())
      tensors.emplace_back(name, file.tensor<float>(name));
    remat::io::save(path, tensors, metadata);
    remat::nn::GPT<float> d(ts_config(4));
    remat::optim::AdamW<float> od(d.parameters());
    INFO(key << " = " << value);
    if (valid) {
      CHECK_NOTHROW(remat::train::load_training_state(path, d, od));
      continue;
    }
    const auto before = ts_values(d);
    const std::string message =
        error_message([&] { remat::train::load_training_state(path, d, od); });
    CHECK_THAT(message, Catch::Contains(path) && Catch::Contains("'" + key + "'") &&
                            Catch::Contains("'" + value + "'") &&
                            Catch::Contains("nothing was loaded"));
    CHECK(ts_values(d) == before);
    CHECK(od.lr() != std::stod(value == "infinity" ? "inf" : value));
  }
}

TEST_CASE("the training state fuzzer's seed corpus holds what its names say",
          "[train][io][errors]") {
  const fs::path corpus = fs::path(__FILE__).parent_path().parent_path().parent_path() / "fuzz" /
                          "corpus" / "training_state";
  REQUIRE(fs::is_directory(corpus));
  int valid = 0, rejected = 0;
  for (const auto& e : fs::directory_iterator(corpus)) {
    const std::string name = e.path().filename().string();
    INFO(name);
    // the fuzzer's model: a (1 x 2) linear layer without bias, and AdamW
    remat::Rng rng(1);
    remat::nn::Linear<float> model(2, 1, rng, false);
    remat::optim::AdamW<float> opt(model.parameters());
    if (name.rfind("valid_", 0) == 0) {
      CHECK_NOTHROW(remat::train::load_training_state(e.path().string(), model, opt));
      ++valid;
    } else {
      CHECK_THROWS_AS(remat::train::load_training_state(e.path().string(), model, opt), IoError);
      ++rejected;
    }
  }
  CHECK(valid >= 2);
  CHECK(rejected >= 9);
}
