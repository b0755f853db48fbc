// The model's parameter list: specs for all, tensors for the held ones.
#include "model/param_registry.h"

#include <utility>

#include "model/init.h"
#include "parm/error.h"
#include "parm/memory.h"

namespace parm::model {

Param* ParamRegistry::add(bool held, const std::string& name, Shape whole,
                          std::vector<Split> splits, std::vector<Group> replicated, Group reduce,
                          bool decay) {
  const Shape local = held ? local_shape(whole, splits) : Shape{0};
  Tensor value, grad;
  {
    MemoryKindScope kind(MemoryKind::kParameters);
    value = Tensor(local, device_);
  }
  {
    MemoryKindScope kind(MemoryKind::kGradients);
    grad = Tensor(local, device_);
  }
  return add_alias(held, name, std::move(whole), std::move(splits), std::move(replicated),
                   reduce, decay, std::move(value), std::move(grad));
}

Param* ParamRegistry::add_alias(bool held, const std::string& name, Shape whole,
                                std::vector<Split> splits, std::vector<Group> replicated,
                                Group reduce, bool decay, Tensor value, Tensor grad) {
  specs_.push_back({name, whole});
  if (!held) return nullptr;
  auto p = std::make_unique<Param>();
  p->name = name;
  p->whole_shape = std::move(whole);
  p->splits = std::move(splits);
  PARM_CHECK(value.shape() == local_shape(p->whole_shape, p->splits),
             "param {}: local tensor {} is not the shard {} of {}", name,
             shape_str(value.shape()), shape_str(local_shape(p->whole_shape, p->splits)),
             shape_str(p->whole_shape));
  p->value = std::move(value);
  p->grad = std::move(grad);
  p->replicated_over = std::move(replicated);
  p->grad_reduce = reduce;
  p->weight_decay = decay;
  params_.push_back(std::move(p));
  return params_.back().get();
}

void ParamRegistry::init(Param* p, float mean, float stddev) const {
  if (p == nullptr) return;
  if (p->value.on_host()) return init_param_normal(*p, seed_, mean, stddev);
  Param host = *p;
  host.value = Tensor(p->value.shape());
  init_param_normal(host, seed_, mean, stddev);
  p->value.copy_from(host.value);
}

std::vector<Param*> ParamRegistry::params() const {
  std::vector<Param*> out;
  for (const auto& p : params_) out.push_back(p.get());
  return out;
}

void ParamRegistry::zero_grads() {
  for (auto& p : params_) p->grad.zero();
}

}  // namespace parm::model
