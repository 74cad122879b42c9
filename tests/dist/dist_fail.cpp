// A data-parallel job in which one rank fails at step 3: `throw` makes rank 1 throw a
// remat::Error in the middle of its backward pass (caught in main, printed, job aborted);
// `kill` makes rank 1 kill itself with SIGKILL. Either way the other ranks are blocked in a
// reduction that will never complete; the job must still end, non-zero, with a message.
#include <remat/dist/data_parallel.hpp>
#include <remat/remat.hpp>

#include <csignal>
#include <cstdio>
#include <string>

namespace {
inline constexpr remat::OpType kBoomOp{"boom"};
}  // namespace

int main(int argc, char** argv) {
  remat::dist::Environment mpi(argc, argv);
  const std::string mode = argc > 1 ? argv[1] : "throw";
  auto comm = remat::dist::Communicator::world();
  try {
    remat::set_num_threads(1);
    remat::nn::GPT<float> gpt({.vocab = 7, .context = 4, .layers = 2, .heads = 2, .width = 8});
    remat::dist::DataParallel<float> dp(comm, gpt.parameters(),
                                        {.bucket_bytes = 512, .first_bucket_bytes = 512});
    remat::optim::AdamW<float> opt(dp.optimizer_parameters());
    for (int step = 0; step < 1000000; ++step) {
      remat::Tensor<std::int32_t> x = remat::Tensor<std::int32_t>::full({2, 4}, comm.rank() % 7);
      remat::Tape tape;
      remat::Var<float> loss = gpt.loss(x, x);
      if (step == 3 && comm.rank() == 1) {
        if (mode == "kill") std::raise(SIGKILL);
        // fails inside the sweep, after some buckets have started
        struct Boom : remat::Node<float> {
          const remat::OpType& op_type() const noexcept override { return kBoomOp; }
          remat::Tensor<float> forward(Inputs in) override { return in[0].clone(); }
          void backward(const remat::Tensor<float>&, remat::Grads<float>&) override {
            throw remat::NumericError(
                "boom: a failure injected into rank 1's backward pass at step 3");
          }
        };
        loss = remat::apply<float>(std::make_unique<Boom>(), {loss});
      }
      dp.backward(tape, loss);
      dp.step(opt);
      opt.zero_grad();
    }
  } catch (const remat::Error& e) {
    std::fprintf(stderr, "rank %d: %s\n", comm.rank(), e.what());
    remat::dist::abort(1);
  }
  return 0;
}
