#include "tools/m2n_plan/model.h"

#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

namespace m2nplan {
namespace {

bool endsWith(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

std::string replaceAll(std::string s, const std::string& from, const std::string& to) {
  for (size_t pos = s.find(from); pos != std::string::npos; pos = s.find(from, pos + to.size())) s.replace(pos, from.size(), to);
  return s;
}

}  // namespace

bool parseDtype(const std::string& s, ncclDataType_t* out) {
  static const struct {
    const char* name;
    ncclDataType_t type;
  } kTypes[] = {{"bf16", ncclBfloat16}, {"bfloat16", ncclBfloat16}, {"fp16", ncclFloat16}, {"float16", ncclFloat16},
                {"fp32", ncclFloat32},  {"float32", ncclFloat32},   {"fp8", ncclFloat8e4m3}, {"fp8_e4m3", ncclFloat8e4m3},
                {"int8", ncclInt8},     {"int32", ncclInt32},       {"int64", ncclInt64}};
  for (const auto& t : kTypes)
    if (s == t.name) {
      *out = t.type;
      return true;
    }
  return false;
}

bool parseModelJson(const std::string& text, Model* model, std::string* error) {
  nlohmann::json j = nlohmann::json::parse(text, nullptr, false);
  if (j.is_discarded() || !j.is_object()) {
    *error = "not a JSON object";
    return false;
  }
  Model m;
  m.name = j.value("name", std::string("model"));
  m.numLayers = j.value("num_layers", 0);
  if (!j.contains("tensors") || !j["tensors"].is_array()) {
    *error = "no \"tensors\" list";
    return false;
  }
  for (const auto& e : j["tensors"]) {
    if (!e.is_object() || !e.contains("name") || !e.contains("shape") || !e["name"].is_string() ||
        !e["shape"].is_array()) {
      *error = "a tensor entry needs \"name\" and \"shape\": " + e.dump();
      return false;
    }
    TensorDesc base;
    base.name = e["name"].get<std::string>();
    for (const auto& d : e["shape"]) {
      if (!d.is_number_integer() || d.get<int64_t>() < 0) {
        *error = base.name + ": shape entries must be integers >= 0";
        return false;
      }
      base.shape.push_back(d.get<int64_t>());
    }
    if (!parseDtype(e.value("dtype", std::string("bf16")), &base.dtype)) {
      *error = base.name + ": unknown dtype " + e.value("dtype", std::string());
      return false;
    }
    int first = -1, end = 0;
    if (e.contains("layers")) {
      const auto& l = e["layers"];
      if (!l.is_array() || l.size() != 2 || !l[0].is_number_integer() || !l[1].is_number_integer()) {
        *error = base.name + ": \"layers\" must be [first, end)";
        return false;
      }
      first = l[0].get<int>();
      end = l[1].get<int>();
    }
    const int experts = e.value("experts", 0);
    const bool hasLayer = contains(base.name, "{layer}"), hasExpert = contains(base.name, "{expert}");
    if (hasLayer != (first >= 0) || hasExpert != (experts > 0)) {
      *error = base.name + ": {layer} goes with \"layers\", {expert} with \"experts\"";
      return false;
    }
    const int layerLo = first >= 0 ? first : -1, layerHi = first >= 0 ? end : 0;
    for (int layer = layerLo; layer < std::max(layerHi, layerLo + 1); layer++) {
      for (int ex = 0; ex < std::max(experts, 1); ex++) {
        TensorDesc t = base;
        t.layer = layer;
        t.expert = experts > 0 ? ex : -1;
        if (hasLayer) t.name = replaceAll(t.name, "{layer}", std::to_string(layer));
        if (hasExpert) t.name = replaceAll(t.name, "{expert}", std::to_string(ex));
        if (!hasLayer) {
          // A layer index in a plain name ("model.layers.7.") still places the tensor on its stage.
          const std::string key = ".layers.";
          size_t pos = t.name.find(key);
          if (pos != std::string::npos) t.layer = atoi(t.name.c_str() + pos + key.size());
        }
        m.tensors.push_back(std::move(t));
      }
    }
  }
  for (const TensorDesc& t : m.tensors) {
    if (t.expert < 0) continue;
    if (t.layer < 0) {
      *error = t.name + ": an expert weight needs a layer";
      return false;
    }
    if ((int)m.expertsInLayer.size() <= t.layer) m.expertsInLayer.resize(t.layer + 1, 0);
    m.expertsInLayer[t.layer] = std::max(m.expertsInLayer[t.layer], t.expert + 1);
  }
  *model = std::move(m);
  return true;
}

bool loadModel(const std::string& path, Model* model, std::string* error) {
  std::ifstream f(path);
  if (!f) {
    *error = "cannot read " + path;
    return false;
  }
  std::stringstream ss;
  ss << f.rdbuf();
  if (!parseModelJson(ss.str(), model, error)) {
    *error = path + ": " + *error;
    return false;
  }
  return true;
}

bool parseParallel(const std::string& spec, Parallel* out, std::string* error) {
  Parallel p;
  std::stringstream ss(spec);
  std::string item;
  while (std::getline(ss, item, ',')) {
    const size_t eq = item.find('=');
    char* end = nullptr;
    const long v = eq == std::string::npos ? 0 : strtol(item.c_str() + eq + 1, &end, 10);
    if (eq == std::string::npos || !end || *end != '\0' || v < 1 || v > (1 << 20)) {
      *error = "bad item \"" + item + "\" in \"" + spec + "\" (want tp=, pp=, dp=, ep=, etp= with values >= 1)";
      return false;
    }
    const std::string key = item.substr(0, eq);
    if (key == "tp") p.tp = (int)v;
    else if (key == "pp") p.pp = (int)v;
    else if (key == "dp") p.dp = (int)v;
    else if (key == "ep") p.ep = (int)v;
    else if (key == "etp") p.etp = (int)v;
    else {
      *error = "unknown key \"" + key + "\" in \"" + spec + "\"";
      return false;
    }
  }
  if (p.dp % p.ep != 0) {
    *error = "ep=" + std::to_string(p.ep) + " must divide dp=" + std::to_string(p.dp) + " (experts live in the DP group)";
    return false;
  }
  if (p.etp != -1 && p.etp != 1 && p.etp != p.tp) {
    *error = "etp must be 1 or tp";
    return false;
  }
  *out = p;
  return true;
}

Sharding shardingOf(const std::string& name) {
  if (!endsWith(name, ".weight") && !endsWith(name, ".bias")) return Sharding::kReplicate;
  const bool bias = endsWith(name, ".bias");
  static const char* kVocab[] = {"embed_tokens.weight", "lm_head.weight", "shared_head.head.weight"};
  for (const char* v : kVocab)
    if (endsWith(name, v)) return Sharding::kVocab;
  static const char* kColumn[] = {".q_proj.", ".k_proj.", ".v_proj.", ".qkv_proj.", ".gate_proj.", ".up_proj.",
                                  ".gate_up_proj.", ".q_b_proj.", ".kv_b_proj."};
  for (const char* c : kColumn)
    if (contains(name, c)) return Sharding::kColumn;
  static const char* kRow[] = {".o_proj.", ".down_proj."};
  for (const char* r : kRow)
    if (contains(name, r)) return bias ? Sharding::kReplicate : Sharding::kRow;  // a row-parallel bias is whole
  return Sharding::kReplicate;  // norms, routers, MLA down-projections, MTP projections
}

bool megatronLayout(const Model& model, const TensorDesc& t, const Parallel& par, ncclm2n::Layout* out,
                    std::string* error) {
  // Pipeline stage: layers split evenly in order; embeddings on the first stage, everything else past the last
  // layer (final norm, lm_head, MTP layers) on the last.
  int stage = 0;
  if (t.layer >= 0 && model.numLayers > 0) {
    stage = std::min(par.pp - 1, (int)((int64_t)t.layer * par.pp / model.numLayers));
  } else if (!contains(t.name, "embed_tokens")) {
    stage = par.pp - 1;
  }
  const Sharding sh = shardingOf(t.name);
  int dim = sh == Sharding::kRow ? 1 : 0;
  if (sh != Sharding::kReplicate && dim >= (int)t.shape.size()) dim = (int)t.shape.size() - 1;
  const int base = par.firstRank + stage * par.dp * par.tp;
  ncclm2n::Layout l;
  l.globalShape = t.shape;
  l.dtype = t.dtype;
  if (t.expert < 0) {
    // Mesh [dp, tp] of the stage: (Replicate, Shard(dim)) or fully replicated.
    l.mesh.dims = {par.dp, par.tp};
    for (int d = 0; d < par.dp; d++)
      for (int k = 0; k < par.tp; k++) l.mesh.ranks.push_back(base + d * par.tp + k);
    l.placements = {ncclm2n::kReplicate, sh == Sharding::kReplicate ? ncclm2n::kReplicate : dim};
  } else {
    // Experts: EP groups are blocks of ep consecutive DP indices; expert e sits at EP index e / (E / ep) of every
    // group, replicated across the dp / ep groups, and sharded over tp when etp = tp.
    const int numExperts = model.expertsInLayer.at(t.layer);
    if (numExperts % par.ep != 0) {
      *error = t.name + ": " + std::to_string(numExperts) + " experts do not split over ep=" + std::to_string(par.ep);
      return false;
    }
    const int g = t.expert / (numExperts / par.ep);
    const bool etpSharded = (par.etp == -1 ? par.tp : par.etp) > 1;
    l.mesh.dims = {par.dp / par.ep, par.tp};
    for (int r = 0; r < par.dp / par.ep; r++)
      for (int k = 0; k < par.tp; k++) l.mesh.ranks.push_back(base + (r * par.ep + g) * par.tp + k);
    l.placements = {ncclm2n::kReplicate,
                    sh == Sharding::kReplicate || !etpSharded ? ncclm2n::kReplicate : dim};
  }
  *out = std::move(l);
  return true;
}

}  // namespace m2nplan
