#include "moe/backend.h"

#include "parm/error.h"

#ifdef PARM_HAVE_CUDA
#include "moe/cuda/cuda_backend.h"
#endif

namespace parm::moe {

void check_router_options(Device device, float router_z_loss, float router_bias_update,
                          const RouterSpec& router) {
  if (device == Device::kCpu) return;
  PARM_CONFIG_CHECK(router.is_default(),
                    "the router options{} with --device {}: --router-score, "
                    "--router-topk-norm, --router-scale and --router-groups run on the CPU "
                    "layer only (the {} gate is docs/spec.md §2's softmax top-k); use "
                    "--device cpu, or their defaults",
                    router.str(), device_name(device), device_name(device));
  PARM_CONFIG_CHECK(router_z_loss == 0.0f,
                    "--router-z-loss (model.router_z_loss) {} with --device {}: the router "
                    "z-loss runs on the CPU layer only (the {} gate computes none); use "
                    "--device cpu, or a z-loss of 0",
                    router_z_loss, device_name(device), device_name(device));
  PARM_CONFIG_CHECK(router_bias_update == 0.0f,
                    "--router-bias-update (model.router_bias_update) {} with --device {}: the "
                    "router bias runs on the CPU layer only (the {} gate takes none); use "
                    "--device cpu, or a rate of 0",
                    router_bias_update, device_name(device), device_name(device));
}

void check_expert_mlp(Device device, Precision precision, ExpertMlp mlp) {
  if (!is_gated(mlp)) return;
  PARM_CONFIG_CHECK(device == Device::kCpu,
                    "--expert-mlp (model.expert_mlp) {} with --device {}: the gated experts "
                    "run on the CPU layer only (the {} experts are gelu's, and have not run on "
                    "a GPU yet); use --device cpu, or --expert-mlp gelu",
                    expert_mlp_name(mlp), device_name(device), device_name(device));
  (void)precision;  // the CPU layer runs them at fp32 and bf16
}

void check_shared_experts(Device device, Precision precision, int shared_experts) {
  if (shared_experts == 0) return;
  PARM_CONFIG_CHECK(device == Device::kCpu,
                    "--shared-experts (model.shared_experts) {} with --device {} --precision "
                    "{}: the shared experts run on the CPU layer only (at fp32 or bf16; they "
                    "have not run on a GPU yet); use --device cpu, or --shared-experts 0",
                    shared_experts, device_name(device), precision_name(precision));
}

std::unique_ptr<LayerBackend> make_backend(Device device, Precision precision,
                                           const BackendSizes& sizes) {
  check_device(device, precision);
  check_expert_mlp(device, precision, sizes.expert_mlp);
  check_shared_experts(device, precision, sizes.shared_experts);
  PARM_CONFIG_CHECK(sizes.acts_pool == nullptr || device == Device::kCpu,
                    "--recompute moe-act (train.recompute) with --device {}: the experts' "
                    "activations are recomputed by the CPU layer only; use --recompute block "
                    "or none there", device_name(device));
  if (device == Device::kCpu) return make_cpu_backend(sizes, precision);
#ifdef PARM_HAVE_CUDA
  return make_cuda_backend(precision, sizes);
#else
  PARM_CHECK(false, "unreachable: check_device accepted cuda in a build without CUDA");
  return nullptr;
#endif
}

}  // namespace parm::moe
