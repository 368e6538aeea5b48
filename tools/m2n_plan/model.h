// Model configs and Megatron-style parallel layouts for the m2n_plan tool (host C++; not part of the library).
//
// Config (JSON): {"name": ..., "num_layers": L, "tensors": [{"name", "shape", "dtype", "layers"?: [first, end),
// "experts"?: E}, ...]}. A name may hold "{layer}" and "{expert}", expanded over "layers" and 0..E-1.
//
// Parallel layout "tp=T,pp=P,dp=D[,ep=X][,etp=Y]": world = T * P * D ranks, rank = first + (pp * D + dp) * T + tp
// (tensor-parallel fastest, then data-parallel, then pipeline, as Megatron orders them). See docs/M2N_PLAN.md for
// which weights are column-, row- or vocab-parallel, where layers and experts live.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "nccl_m2n/src/plan.h"

namespace m2nplan {

struct TensorDesc {
  std::string name;
  std::vector<int64_t> shape;
  ncclDataType_t dtype = ncclBfloat16;
  int layer = -1;   // -1: not in a layer
  int expert = -1;  // -1: not an expert weight
};

struct Model {
  std::string name;
  int numLayers = 0;
  std::vector<TensorDesc> tensors;
  std::vector<int> expertsInLayer;  // by layer index: number of experts (0: a dense layer)
};

struct Parallel {
  int tp = 1, pp = 1, dp = 1, ep = 1, etp = -1;  // etp -1: = tp
  int firstRank = 0;
  int worldSize() const { return tp * pp * dp; }
};

// Each returns false and says why in `error`.
bool parseDtype(const std::string& s, ncclDataType_t* out);
bool loadModel(const std::string& path, Model* model, std::string* error);
bool parseModelJson(const std::string& text, Model* model, std::string* error);
bool parseParallel(const std::string& spec, Parallel* out, std::string* error);

enum class Sharding { kReplicate, kColumn, kRow, kVocab };
// The Megatron convention for a tensor, by name (docs/M2N_PLAN.md).
Sharding shardingOf(const std::string& name);

// The layout of one tensor under a parallel scheme.
bool megatronLayout(const Model& model, const TensorDesc& t, const Parallel& par, ncclm2n::Layout* out,
                    std::string* error);

}  // namespace m2nplan
