// An LSTM language model in the style of pytorch/examples' word_language_model (Embedding -> LSTM
// -> dropout -> Linear, the hidden state carried from batch to batch, clipping), as one program
// that runs either unsharded (--reference: the program as it was, one process) or ported to
// fsdp-cpp (under fsdprun). bench/lstm_port.py times the port against W reference processes run
// at the same time (the concurrent floor); bench/README.md, "An LSTM language model's port".
//
//   build/bin/lstm_port --reference --metrics ref.jsonl
//   build/bin/fsdprun --nproc-per-node 2 build/bin/lstm_port --metrics 'port-rank{rank}.jsonl' [--units]
#include <fsdp/fsdp.h>
#include <fsdp/trace.h>

#include <CLI/CLI.hpp>
#include <torch/torch.h>

#include <chrono>
#include <fstream>
#include <type_traits>

namespace {

struct Options {
  bool reference = false;
  bool units = false;  // the port with the LSTM and the decoder as units of their own
  int64_t vocab = 33278, dim = 150, layers = 2, batch = 20, bptt = 30, steps = 20, world = 2;
  double dropout = 0.2, lr = 20, clip = 0.25;
  std::string optimizer = "sgd", metrics, trace;
  uint64_t seed = 1111;
};

// The model of word_language_model's model.py (RNNModel with an LSTM). With Units, the LSTM and
// the decoder are fsdp units (the port's option beyond the root unit); else plain holders.
template <bool Units>
struct RNNModelImpl : torch::nn::Module {
  template <class M>
  using Held = std::conditional_t<Units, fsdp::Unit<M>, M>;

  RNNModelImpl(const Options& o)
      : encoder(register_module("encoder", torch::nn::Embedding(o.vocab, o.dim))),
        rnn(register_module("rnn", Held<torch::nn::LSTM>(
                                       torch::nn::LSTMOptions(o.dim, o.dim).num_layers(o.layers).dropout(o.dropout)))),
        decoder(register_module("decoder", Held<torch::nn::Linear>(o.dim, o.vocab))),
        drop(register_module("drop", torch::nn::Dropout(o.dropout))) {
    torch::NoGradGuard no_grad;  // model.py's init_weights
    encoder->weight.uniform_(-0.1, 0.1);
    decoder->weight.uniform_(-0.1, 0.1);
    decoder->bias.zero_();
  }

  using Hidden = std::tuple<torch::Tensor, torch::Tensor>;
  std::tuple<torch::Tensor, Hidden> forward(const torch::Tensor& input, const Hidden& hidden) {
    auto emb = drop->forward(encoder->forward(input));
    auto [output, next] = rnn->forward(emb, hidden);
    return {decoder->forward(drop->forward(output)), next};
  }

  torch::nn::Embedding encoder;
  Held<torch::nn::LSTM> rnn;
  Held<torch::nn::Linear> decoder;
  torch::nn::Dropout drop;
};

Options parse(int argc, char** argv) {
  Options o;
  CLI::App app{"An LSTM language model, unsharded (--reference) or ported to fsdp-cpp"};
  app.add_flag("--reference", o.reference, "the unsharded program, one process");
  app.add_flag("--units", o.units, "the port with the LSTM and the decoder as units");
  app.add_option("--vocab", o.vocab);
  app.add_option("--dim", o.dim, "embedding and hidden size");
  app.add_option("--layers", o.layers);
  app.add_option("--batch", o.batch, "sequences per rank");
  app.add_option("--bptt", o.bptt);
  app.add_option("--steps", o.steps);
  app.add_option("--world-size", o.world, "--reference: whose rows (rank 0's of this many)");
  app.add_option("--lr", o.lr);
  app.add_option("--clip", o.clip);
  app.add_option("--optimizer", o.optimizer)->check(CLI::IsMember({"sgd", "adam"}));
  app.add_option("--seed", o.seed);
  app.add_option("--metrics", o.metrics, "JSON lines, one per step ({rank} is replaced)");
  app.add_option("--trace", o.trace, "the port: a Chrome trace of the last step ({rank} is replaced)");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    std::exit(app.exit(e));
  }
  return o;
}

// Synthetic token ids, the same stream on every side: step s's global batch is
// [bptt + 1, world * batch]; rank r trains on columns [r * batch, (r + 1) * batch).
torch::Tensor batch_of(const Options& o, int64_t step, int rank) {
  auto gen = at::detail::createCPUGenerator(o.seed + static_cast<uint64_t>(step));
  auto tokens = torch::randint(0, o.vocab, {o.bptt + 1, o.world * o.batch}, gen);
  return tokens.narrow(1, rank * o.batch, o.batch);
}

std::unique_ptr<torch::optim::Optimizer> make_optimizer(const Options& o, std::vector<torch::Tensor> params) {
  if (o.optimizer == "adam") return std::make_unique<torch::optim::Adam>(params, torch::optim::AdamOptions(o.lr));
  return std::make_unique<torch::optim::SGD>(params, torch::optim::SGDOptions(o.lr));
}

std::string for_rank(std::string path, int rank) {
  const auto at = path.find("{rank}");
  if (at != std::string::npos) path.replace(at, 6, std::to_string(rank));
  return path;
}

// main.py's train loop: the hidden state carried over (detached), clipping, one step per batch.
// Clip is the program's own clipping (LibTorch's or fsdp's); returns nothing, writes each step's time.
template <class Model, class Clip>
void train(const Options& o, Model& model, Clip clip, int rank) {
  auto optimizer = make_optimizer(o, model->parameters());
  std::ofstream metrics;
  if (!o.metrics.empty()) metrics.open(for_rank(o.metrics, rank));
  auto zeros = torch::zeros({o.layers, o.batch, o.dim});
  std::tuple<torch::Tensor, torch::Tensor> hidden{zeros, zeros};
  model->train();
  for (int64_t step = 0; step < o.steps; ++step) {
    const auto tokens = batch_of(o, step, rank);
    const bool traced = !o.trace.empty() && !o.reference && step + 1 == o.steps;
    if (traced) fsdp::start_trace();
    const auto start = std::chrono::steady_clock::now();
    hidden = {std::get<0>(hidden).detach(), std::get<1>(hidden).detach()};  // repackage_hidden
    optimizer->zero_grad();
    auto [logits, next] = model->forward(tokens.narrow(0, 0, o.bptt), hidden);
    hidden = next;
    torch::Tensor loss = torch::nn::functional::cross_entropy(logits.view({-1, o.vocab}), tokens.narrow(0, 1, o.bptt).reshape(-1));
    loss.backward();
    clip(model->parameters(), o.clip);
    optimizer->step();
    const double value = loss.item<double>();
    const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
    if (metrics.is_open()) metrics << "{\"step\": " << step << ", \"step_ms\": " << ms << ", \"loss\": " << value << "}\n" << std::flush;
    if (traced) fsdp::write_trace(for_rank(o.trace, rank), rank);
    if (rank == 0) std::printf("step %ld loss %.4f %.1f ms\n", static_cast<long>(step), value, ms);
  }
}

template <bool Units>
void run(const Options& o) {
  if (o.reference) {
    torch::manual_seed(o.seed);
    auto model = std::make_shared<RNNModelImpl<false>>(o);
    train(o, model, [](const auto& params, double max) { torch::nn::utils::clip_grad_norm_(params, max); }, 0);
    return;
  }
  auto dist = fsdp::init_distributed();
  torch::manual_seed(o.seed);  // the reference's initial model on every rank
  auto model = fsdp::fully_shard(std::make_shared<RNNModelImpl<Units>>(o), *dist->world);
  train(o, model, [](const auto& params, double max) { fsdp::clip_grad_norm_(params, max); }, dist->rank());
}

}  // namespace

int main(int argc, char** argv) {
  const auto o = parse(argc, argv);
  if (o.units) {
    run<true>(o);
  } else {
    run<false>(o);
  }
}
