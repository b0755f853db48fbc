// The torch.distributed backend of parm.init(backend="torch"): Parm's communicators over
// torch process groups (comm/external_communicator.h), each operation handed to the Python
// object parm._torch_backend.Group (torch.distributed's async calls on the caller's buffers,
// borrowed in place as DLPack tensors) and waited for through torch's work handles.
#pragma once

#include <pybind11/pybind11.h>

#include <memory>
#include <string>
#include <vector>

#include "parm/topology.h"

namespace parm::py_torch {

// A CPU topology of `layout` (make_layout of these values) over the torch groups in
// `groups` (group name -> parm._torch_backend.Group, one for every Parm group, this rank a
// member of each; gloo groups: they move host memory), this rank `world_rank`, nodes
// `node_of_rank`. device "cuda": Parm's NCCL communicators bootstrapped over them
// (Topology::adopt). Throws InvalidConfig when a group's size or this rank's place in it is
// not the layout's.
std::unique_ptr<Topology> adopt(int world, int mp, int ep, int esp, int pp,
                                const std::string& order, double timeout_s, int world_rank,
                                const std::vector<int>& node_of_rank,
                                const pybind11::dict& groups, const std::string& device);

}  // namespace parm::py_torch
