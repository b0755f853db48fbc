// The model's parameters in the order they are registered (the same names and order on every
// layout and stage): every parameter of the whole model gets its spec (the checkpoint's tensor
// list); the ones this stage holds also get their local tensors, zero-filled on the model's
// device or aliasing tensors another object owns (the MoE layers').
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "model/model.h"
#include "model/param.h"

namespace parm::model {

class ParamRegistry {
 public:
  // Tensors live on `device`; init_* draw from `seed` (model/init.h), biases and gains with
  // standard deviation `init_bias_std` (ModelConfig::init_bias_std).
  ParamRegistry(Device device, uint64_t seed, float init_bias_std)
      : device_(device), seed_(seed), init_bias_std_(init_bias_std) {}

  // Registers a parameter of the whole model. `held`: this stage holds it, and it gets its
  // local shard (whole cut by `splits`) and gradient, zero-filled, and is returned; else only
  // its spec is recorded and the result is null.
  Param* add(bool held, const std::string& name, Shape whole, std::vector<Split> splits,
             std::vector<Group> replicated, Group reduce, bool decay);
  // As add, the local value and gradient being `value` and `grad` (shared, not copied);
  // throws parm::Error when they are not the shard's shape.
  Param* add_alias(bool held, const std::string& name, Shape whole, std::vector<Split> splits,
                   std::vector<Group> replicated, Group reduce, bool decay, Tensor value,
                   Tensor grad);

  // Initial values (p null: a parameter of another stage, nothing to do).
  void init_weight(Param* p, float stddev) const { init(p, 0.0f, stddev); }
  void init_bias(Param* p) const { init(p, 0.0f, init_bias_std_); }
  void init_gain(Param* p) const { init(p, 1.0f, init_bias_std_); }

  // The held parameters, in registration order.
  std::vector<Param*> params() const;
  // Every parameter of the whole model, in registration order.
  const std::vector<ParamSpec>& specs() const { return specs_; }
  void zero_grads();

 private:
  // Drawn on the host (the same numbers on every device), then copied to the device.
  void init(Param* p, float mean, float stddev) const;

  Device device_;
  uint64_t seed_;
  float init_bias_std_;
  std::vector<ParamSpec> specs_;
  std::vector<std::unique_ptr<Param>> params_;
};

}  // namespace parm::model
