// The conformance scenarios of conformance.hpp, compiled once for every test executable that
// runs them (the CPU conformance tests, the GPU and logical-GPU tests).
#include "conformance.hpp"

namespace mirrored::conformance {

std::vector<Device> parse_all(const std::vector<std::string>& specs) {
  std::vector<Device> out;
  for (const auto& s : specs) out.push_back(Device::parse(s));
  return out;
}

// ---------------------------------------------------------------------------------------------
// Tensors on one device.

template <class T>
void tensor_ops_of(Recorder& rec, const Device& d, const std::string& tag) {
  const auto a = Tensor<T>::from_vector({T(1), T(2), T(3), T(4), T(6), T(8)}, {2, 3}, d);
  const auto b = Tensor<T>::from_vector({T(2), T(1), T(4), T(2), T(3), T(8)}, {2, 3}, d);
  const auto s = Tensor<T>::scalar(T(2), d);
  rec.tensor(tag + "a+b", a + b, d);
  rec.tensor(tag + "a-b", a - b, d);
  rec.tensor(tag + "a*b", a * b, d);
  rec.tensor(tag + "a/b", a / b, d);
  rec.tensor(tag + "a+2", a + 2, d);
  rec.tensor(tag + "10-a", 10 - a, d);
  rec.tensor(tag + "a*s", a * s, d);
  rec.tensor(tag + "s*a", s * a, d);
  rec.tensor(tag + "a/s", a / s, d);
  rec.tensor(tag + "s/b", s / b, d);
  rec.tensor(tag + "full", Tensor<T>::full({3, 1, 2}, T(5), d), d);
  rec.tensor(tag + "zeros", Tensor<T>::zeros({4}, d), d);
  rec.tensor(tag + "empty_op", Tensor<T>::zeros({0, 3}, d) + Tensor<T>::zeros({0, 3}, d), d);
  rec.tensor(tag + "reshape", a.reshape({3, 2}), d);
  rec.tensor(tag + "clone", a.clone(), d);
  rec.tensor(tag + "to_host", a.to(cpu0), cpu0);
  rec.tensor(tag + "round_trip", a.to(cpu0).to(d), d);
  if constexpr (is_half_v<T>)
    rec.tensor(tag + "item", Tensor<T>::scalar(Tensor<T>::scalar(T(7), d).item()));
  else
    rec.number(tag + "item", Tensor<T>::scalar(T(7), d).item());
}

/// Element-wise ops, fills, casts and copies on device `spec`.
Record tensor_ops(const std::string& spec) {
  const Device d = Device::parse(spec);
  Recorder rec;
  tensor_ops_of<float>(rec, d, "f32 ");
  tensor_ops_of<double>(rec, d, "f64 ");
  tensor_ops_of<int32_t>(rec, d, "i32 ");
  tensor_ops_of<int64_t>(rec, d, "i64 ");
  tensor_ops_of<uint8_t>(rec, d, "u8 ");
  tensor_ops_of<float16>(rec, d, "f16 ");
  tensor_ops_of<bfloat16>(rec, d, "bf16 ");
  // The 2-byte floats: computed in float, rounded once to nearest even (overflow, subnormals, ties).
  const auto wide = Tensor<float>::from_vector({65504.0f, 65520.0f, 5.9604645e-08f, 2049.0f, 257.0f, -0.1f}, {6}, d);
  rec.tensor("cast f32->f16", cast<float16>(wide), d);
  rec.tensor("cast f32->bf16", cast<bfloat16>(wide), d);
  rec.tensor("cast f16->f64", cast<double>(cast<float16>(wide)), d);
  rec.tensor("cast bf16->i32", cast<int32_t>(cast<bfloat16>(wide)), d);
  rec.tensor("cast i64->f16", cast<float16>(Tensor<int64_t>::from_vector({2051, -7, 70000}, {3}, d)), d);
  rec.tensor("cast f16->bf16", cast<bfloat16>(cast<float16>(wide)), d);
  rec.tensor("f16 2048+1", Tensor<float16>::full({2}, float16(2048.0f), d) + 1, d);
  rec.tensor("f16 1/3", Tensor<float16>::full({2}, float16(1.0f), d) / 3, d);
  rec.tensor("bf16 1/3", Tensor<bfloat16>::full({2}, bfloat16(1.0f), d) / 3, d);
  // Fractions, negative numbers, truncating casts, wrapping.
  const auto f = Tensor<float>::from_vector({2.5f, -3.75f, 0.125f, 100.0f}, {4}, d);
  rec.tensor("f32/3", f / 3.0f, d);
  rec.tensor("cast f32->f64", cast<double>(f), d);
  rec.tensor("cast f32->i32", cast<int32_t>(f), d);
  rec.tensor("cast f32->i64", cast<int64_t>(f), d);
  rec.tensor("cast i32->u8", cast<uint8_t>(Tensor<int32_t>::from_vector({0, 7, 255, 128}, {4}, d)), d);
  rec.tensor("cast i64->f32", cast<float>(Tensor<int64_t>::from_vector({-5, 1LL << 40}, {2}, d)), d);
  rec.tensor("cast u8->f64", cast<double>(Tensor<uint8_t>::from_vector({0, 200}, {2}, d)), d);
  rec.tensor("i32 -7/2",
             Tensor<int32_t>::from_vector({-7, 7, -7}, {3}, d) / Tensor<int32_t>::from_vector({2, -2, -2}, {3}, d), d);
  rec.tensor("i32 min/-1",
             Tensor<int32_t>::from_vector({std::numeric_limits<int32_t>::min()}, {1}, d) /
                 Tensor<int32_t>::from_vector({-1}, {1}, d),
             d);
  rec.tensor("u8 wrap", Tensor<uint8_t>::from_vector({250, 3}, {2}, d) + uint8_t(10), d);
  // Integer division by zero is an InvalidArgumentError on every device (by the time the result
  // is read: a device with streams raises it at the next synchronize).
  bool threw = false;
  try {
    (void)(Tensor<int64_t>::from_vector({1, 2}, {2}, d) / Tensor<int64_t>::from_vector({1, 0}, {2}, d)).to_vector();
  } catch (const InvalidArgumentError& e) {
    threw = std::string(e.what()).find("division by zero at element 1") != std::string::npos;
  }
  rec.fact("integer division by zero", threw);
  // Larger than the pinned staging slots (4 MiB), odd-sized, both directions.
  std::vector<float> big(3 * 1024 * 1024 + 17);
  for (std::size_t i = 0; i < big.size(); ++i) big[i] = float(i % 4093) - 2000.0f;
  const auto t = Tensor<float>::from_vector(big, {int64_t(big.size())}, d);
  rec.tensor("big", t, d);
  rec.tensor("big*2", t * 2.0f, d);
  // Many small copies in a row (staging slots wrap around).
  auto acc = Tensor<int64_t>::zeros({3}, d);
  for (int64_t i = 0; i < 3000; ++i) acc = acc + Tensor<int64_t>::from_vector({i, 2 * i, 1}, {3}, d);
  rec.tensor("many small copies", acc, d);
  return rec.take();
}

// ---------------------------------------------------------------------------------------------
// Replica-context collectives.

Record collectives(const std::vector<std::string>& specs, std::shared_ptr<CrossDeviceOps> ops) {
  MirroredStrategy s(specs, std::move(ops));
  const auto devs = parse_all(specs);
  const int n = s.num_replicas_in_sync();
  constexpr int64_t kBig = (1 << 20) + 37;
  using Nest = std::map<std::string, std::tuple<Tensor<float>, std::vector<double>>>;
  auto out = s.run([&] {
    ReplicaContext* ctx = get_replica_context();
    const int r = ctx->replica_id_in_sync_group();
    const Device& d = devs[static_cast<std::size_t>(r)];
    const auto x = Tensor<float>::from_vector({float(r), 1, 2, 3, 4.5f, float(-r)}, {2, 3}, d);
    std::vector<float> bigv(kBig);
    for (int64_t i = 0; i < kBig; ++i) bigv[static_cast<std::size_t>(i)] = float(i % 1000 + r);
    const auto big = Tensor<float>::from_vector(bigv, {kBig}, d);
    Nest nest{{"dense", {Tensor<float>::from_vector({float(r), 0.25f}, {2}, d), {1.0, double(r)}}},
              {"bias", {Tensor<float>::full({3}, 2, d), {}}}};
    int64_t seq = 1;
    for (int i = 0; i < 50; ++i) seq = ctx->all_reduce(ReduceOp::SUM, seq % 1000 + r % 2);
    return std::make_tuple(
        ctx->all_reduce(ReduceOp::SUM, x), ctx->all_reduce("mean", x),
        ctx->all_reduce(ReduceOp::SUM, Tensor<double>::from_vector({0.5, double(r)}, {2}, d)),
        ctx->all_reduce(ReduceOp::SUM, Tensor<int32_t>::from_vector({r, 7}, {2}, d)),
        ctx->all_reduce(ReduceOp::SUM, Tensor<int64_t>::from_vector({int64_t(r) << 40}, {1}, d)),
        ctx->all_reduce(ReduceOp::SUM, Tensor<uint8_t>::from_vector({uint8_t(r), 1}, {2}, d)),
        ctx->all_reduce(ReduceOp::SUM, Tensor<float>::zeros({0, 4}, d)), ctx->all_reduce(ReduceOp::SUM, big),
        ctx->all_reduce(ReduceOp::SUM, nest), ctx->all_reduce(ReduceOp::SUM, r),
        ctx->all_reduce(ReduceOp::MEAN, float(2 * r)), ctx->all_gather(Tensor<int32_t>::full({r + 1, 2}, r, d), 0),
        ctx->all_gather(Tensor<float>::from_vector({0, 1, 2, 3, 4, 5}, {1, 2, 3}, d) + float(10 * r), 1),
        ctx->all_gather(Tensor<double>::full({2, r % 2, 2}, double(r), d), 1), seq,
        // The input is untouched.
        x,
        // Exact in the 2-byte floats whatever the order and precision of the sum.
        ctx->all_reduce(ReduceOp::SUM, Tensor<float16>::from_vector({float16(float(r)), float16(0.5f)}, {2}, d)),
        ctx->all_reduce(ReduceOp::MEAN, Tensor<bfloat16>::from_vector({bfloat16(2.0f * r), bfloat16(1.0f)}, {2}, d)));
  });
  Recorder rec;
  for (int r = 0; r < n; ++r) {
    const Device& d = devs[static_cast<std::size_t>(r)];
    const std::string p = "replica " + std::to_string(r) + " ";
    const auto& o = out[static_cast<std::size_t>(r)];
    rec.tensor(p + "sum", std::get<0>(o), d);
    rec.tensor(p + "mean", std::get<1>(o), d);
    rec.tensor(p + "f64", std::get<2>(o), d);
    rec.tensor(p + "i32", std::get<3>(o), d);
    rec.tensor(p + "i64", std::get<4>(o), d);
    rec.tensor(p + "u8", std::get<5>(o), d);
    rec.tensor(p + "empty", std::get<6>(o), d);
    rec.tensor(p + "big", std::get<7>(o), d);
    for (const auto& [k, v] : std::get<8>(o)) {
      rec.tensor(p + "nest " + k, std::get<0>(v), d);
      for (double x : std::get<1>(v)) rec.number(p + "nest " + k + " number", x);
    }
    rec.number(p + "int", std::get<9>(o));
    rec.number(p + "float mean", std::get<10>(o));
    rec.tensor(p + "gather axis 0", std::get<11>(o), d);
    rec.tensor(p + "gather axis 1", std::get<12>(o), d);
    rec.tensor(p + "gather uneven inner", std::get<13>(o), d);
    rec.number(p + "sequence", std::get<14>(o));
    rec.tensor(p + "input", std::get<15>(o), d);
    rec.tensor(p + "f16", std::get<16>(o), d);
    rec.tensor(p + "bf16 mean", std::get<17>(o), d);
    // Every replica owns its outputs.
    rec.fact(p + "own output", r == 0 || std::get<0>(o).data() != std::get<0>(out[0]).data());
  }
  return rec.take();
}

/// Sums whose value depends on the order: equal across devices only for ops that sum in replica
/// order (the default ones).
Record ordered_sums(const std::vector<std::string>& specs, std::shared_ptr<CrossDeviceOps> ops) {
  MirroredStrategy s(specs, std::move(ops));
  const auto devs = parse_all(specs);
  auto inputs = s.experimental_distribute_values_from_function([&](const ValueContext& c) {
    std::vector<float> x(40099);
    for (std::size_t i = 0; i < x.size(); ++i) x[i] = 0.1f * float(i + 1) / float(c.replica_id_in_sync_group + 3);
    return Tensor<float>::from_vector(x, {int64_t(x.size())},
                                      devs[static_cast<std::size_t>(c.replica_id_in_sync_group)]);
  });
  auto out = s.run(
      [](const Tensor<float>& x) {
        auto* ctx = get_replica_context();
        return std::make_pair(ctx->all_reduce(ReduceOp::SUM, x), ctx->all_reduce(ReduceOp::MEAN, x));
      },
      inputs);
  Recorder rec;
  for (int r = 0; r < s.num_replicas_in_sync(); ++r) {
    rec.tensor("sum " + std::to_string(r), out[r].first, devs[static_cast<std::size_t>(r)]);
    rec.tensor("mean " + std::to_string(r), out[r].second, devs[static_cast<std::size_t>(r)]);
  }
  rec.tensor("reduce sum", s.reduce(ReduceOp::SUM, inputs, std::nullopt), cpu0);
  rec.tensor("reduce mean", s.reduce(ReduceOp::MEAN, inputs, std::nullopt), cpu0);
  return rec.take();
}

// ---------------------------------------------------------------------------------------------
// Cross-replica reduce and gather, merge_call.

Record reduce_and_gather(const std::vector<std::string>& specs, std::shared_ptr<CrossDeviceOps> ops) {
  MirroredStrategy s(specs, std::move(ops));
  const auto devs = parse_all(specs);
  auto dev = [&](const ValueContext& c) { return devs[static_cast<std::size_t>(c.replica_id_in_sync_group)]; };
  auto equal = s.experimental_distribute_values_from_function([&](const ValueContext& c) {
    const float r = float(c.replica_id_in_sync_group);
    return Tensor<float>::from_vector({r, 1, 2.5f, -r, 4, 8}, {2, 3}, dev(c));
  });
  auto uneven = s.experimental_distribute_values_from_function([&](const ValueContext& c) {
    const int r = c.replica_id_in_sync_group;
    return Tensor<double>::full({r % 3, 2}, double(r + 1), dev(c));  // replica 0: an empty batch
  });
  auto ints = s.experimental_distribute_values_from_function([&](const ValueContext& c) {
    return Tensor<int64_t>::full({3}, int64_t(c.replica_id_in_sync_group) * 3 + 1, dev(c));
  });
  Recorder rec;
  rec.tensor("sum", s.reduce(ReduceOp::SUM, equal, std::nullopt), cpu0);
  rec.tensor("mean", s.reduce("MEAN", equal, std::nullopt), cpu0);
  rec.tensor("sum axis 0", s.reduce(ReduceOp::SUM, uneven, 0), cpu0);
  rec.tensor("mean axis 0", s.reduce(ReduceOp::MEAN, uneven, 0), cpu0);
  rec.tensor("mean axis -1", s.reduce(ReduceOp::MEAN, equal, -1), cpu0);
  rec.tensor("int sum", s.reduce(ReduceOp::SUM, ints, std::nullopt), cpu0);
  rec.tensor("int mean as f64", s.reduce<double>(ReduceOp::MEAN, ints, std::nullopt), cpu0);
  rec.tensor("gather axis 0", s.gather(uneven, 0), cpu0);
  rec.tensor("gather axis 1", s.gather(equal, 1), cpu0);
  // Values returned by run: numbers and nests.
  auto from_run = s.run(
      [&](const Tensor<float>& x) {
        const int r = get_replica_context()->replica_id_in_sync_group();
        return std::make_tuple(float(r) * 0.5f, std::vector<Tensor<float>>{x * 2.0f, x});
      },
      equal);
  const auto [num, vec] = s.reduce(ReduceOp::SUM, from_run, std::nullopt);
  rec.number("numbers", num);
  for (const auto& t : vec) rec.tensor("nest", t, cpu0);
  for (std::size_t r = 0; r < equal.size(); ++r)
    rec.tensor("local result", s.experimental_local_results(equal)[r], devs[r]);
  // merge_call: a reduction inside merge_fn reaches every replica; a PerReplica result gives each
  // replica its own component.
  auto merged = s.run(
      [&](const Tensor<float>& x) {
        auto* ctx = get_replica_context();
        Tensor<float> total = ctx->merge_call(
            [](Strategy& st, const PerReplica<Tensor<float>>& v) { return st.reduce(ReduceOp::SUM, v, std::nullopt); },
            x);
        Tensor<float> own = ctx->merge_call([](Strategy&, const PerReplica<Tensor<float>>& v) { return v; }, x * 3.0f);
        return std::make_pair(total, own);
      },
      equal);
  for (std::size_t r = 0; r < equal.size(); ++r) {
    rec.tensor("merge total " + std::to_string(r), merged[r].first, cpu0);
    rec.tensor("merge own " + std::to_string(r), merged[r].second, devs[r]);
  }
  // reduce_to / batch_reduce_to onto a mirrored variable's devices.
  std::optional<Variable<float>> dest;
  {
    auto scope = s.scope();
    dest.emplace(Tensor<float>::zeros({2, 3}));
  }
  auto mirrored = s.extended().reduce_to(ReduceOp::SUM, equal, *dest);
  for (std::size_t r = 0; r < equal.size(); ++r) rec.tensor("reduce_to " + std::to_string(r), mirrored[r], devs[r]);
  CommunicationOptions packed;
  packed.bytes_per_pack = 16;
  auto batch = s.extended().batch_reduce_to<float>(ReduceOp::MEAN, {{equal, *dest}, {equal, *dest}}, packed);
  for (std::size_t r = 0; r < equal.size(); ++r)
    rec.tensor("batch_reduce_to " + std::to_string(r), batch[1][r], devs[r]);
  return rec.take();
}

// ---------------------------------------------------------------------------------------------
// Variables and an optimizer.

Record variables(const std::vector<std::string>& specs, std::shared_ptr<CrossDeviceOps> ops) {
  MirroredStrategy s(specs, std::move(ops));
  const auto devs = parse_all(specs);
  const int n = s.num_replicas_in_sync();
  auto make = [](const char* name, VariableAggregation agg,
                 VariableSynchronization sync = VariableSynchronization::AUTO) {
    VariableOptions o;
    o.name = name;
    o.aggregation = agg;
    o.synchronization = sync;
    return Variable<float>(Tensor<float>::from_vector({1, 2, 3}, {3}), o);
  };
  std::optional<Variable<float>> none, sum, mean, first, on_read, trained;
  std::unique_ptr<optimizers::SGD<float>> sgd;
  {
    auto scope = s.scope();
    none.emplace(make("none", VariableAggregation::NONE));
    sum.emplace(make("sum", VariableAggregation::SUM));
    mean.emplace(make("mean", VariableAggregation::MEAN));
    first.emplace(make("first", VariableAggregation::ONLY_FIRST_REPLICA));
    on_read.emplace(make("on_read", VariableAggregation::SUM, VariableSynchronization::ON_READ));
    trained.emplace(make("trained", VariableAggregation::NONE));
    sgd = std::make_unique<optimizers::SGD<float>>(optimizers::SGDOptions{.learning_rate = 0.5});
    sgd->build({*trained});
  }
  for (int step = 0; step < 3; ++step) {
    s.run([&] {
      const int r = get_replica_context()->replica_id_in_sync_group();
      const Device& d = devs[static_cast<std::size_t>(r)];
      none->assign_add(Tensor<float>::full({3}, float(r + 1), d));
      sum->assign_add(Tensor<float>::full({3}, float(r + 1), d));
      mean->assign_sub(Tensor<float>::full({3}, float(2 * r), d));
      first->assign(Tensor<float>::full({3}, float(10 + r), d));
      on_read->assign_add(Tensor<float>::full({3}, float(r), d));
      const auto grad = Tensor<float>::from_vector({float(r), 0.25f, -1}, {3}, d);
      sgd->apply_gradients({{grad, *trained}});
    });
  }
  Recorder rec;
  for (auto* v : {&*none, &*sum, &*mean, &*first, &*on_read, &*trained}) {
    const auto copies = v->components();
    for (int r = 0; r < n; ++r)
      rec.tensor(v->name() + " copy " + std::to_string(r), copies[static_cast<std::size_t>(r)],
                 devs[static_cast<std::size_t>(r)]);
  }
  rec.tensor("on_read value", on_read->value());
  rec.tensor("sum read_value", sum->read_value());
  // Cross-replica writes: a PerReplica per copy, a value to every copy, update per copy.
  auto per = s.experimental_distribute_values_from_function([&](const ValueContext& c) {
    return Tensor<float>::full({3}, float(c.replica_id_in_sync_group) + 0.5f,
                               devs[static_cast<std::size_t>(c.replica_id_in_sync_group)]);
  });
  none->assign(per);
  sum->assign_add(Tensor<float>::full({3}, 1));
  s.extended().update(
      *mean, [](Variable<float>& c, const Tensor<float>& x) { c.assign_add(x); }, per);
  on_read->assign(Tensor<float>::full({3}, float(4 * n)));
  for (auto* v : {&*none, &*sum, &*mean, &*on_read}) {
    const auto copies = v->components();
    for (int r = 0; r < n; ++r)
      rec.tensor(v->name() + " after " + std::to_string(r), copies[static_cast<std::size_t>(r)],
                 devs[static_cast<std::size_t>(r)]);
  }
  rec.number("iterations", sgd->iterations());
  return rec.take();
}

// ---------------------------------------------------------------------------------------------
// The input pipeline onto the replicas' devices (experimental_fetch_to_device): slices of 1 MiB
// and more (on a GPU copied directly from the pinned host block of the batch), small ones
// (staged), a second epoch (the host cache recycles the batch blocks), and a replica function
// reading every slice where it landed.

Record distributed_input(const std::vector<std::string>& specs) {
  MirroredStrategy s(specs);
  const auto devs = parse_all(specs);
  const int n = s.num_replicas_in_sync();
  std::vector<float> values(static_cast<std::size_t>(kInputRows * kInputWidth));
  for (std::size_t i = 0; i < values.size(); ++i) values[i] = static_cast<float>(i % 4093);
  const auto data = Tensor<float>::from_vector(values, {kInputRows, kInputWidth});
  Recorder rec;
  auto big = s.experimental_distribute_dataset(data::Dataset<>::from_tensor_slices(data).batch(32));
  for (int epoch = 0; epoch < 2; ++epoch) {
    int step = 0;
    for (const PerReplica<Tensor<float>>& x : big) {
      const std::string tag = "epoch " + std::to_string(epoch) + " step " + std::to_string(step++);
      const auto y = s.run([](const Tensor<float>& t) { return t * 2.0f + 1.0f; }, x);
      for (int r = 0; r < n; ++r) {
        const auto i = static_cast<std::size_t>(r);
        rec.tensor(tag + " slice " + std::to_string(r), x.values()[i], devs[i]);
        rec.tensor(tag + " 2x+1 " + std::to_string(r), y.values()[i], devs[i]);
      }
    }
  }
  auto small = s.experimental_distribute_dataset(data::Dataset<>::range(10).batch(4));
  int step = 0;
  for (const PerReplica<Tensor<int64_t>>& x : small) {
    for (int r = 0; r < n; ++r) {
      const auto i = static_cast<std::size_t>(r);
      rec.tensor("small step " + std::to_string(step) + " slice " + std::to_string(r), x.values()[i], devs[i]);
    }
    ++step;
  }
  return rec.take();
}

}  // namespace mirrored::conformance
