// ncclM2nReshard's plans (nccl_m2n.h): per caller communicator, the plans of the last kReshardPlans distinct keys
// (the layout pair and the config), most recent first, so that a reshard repeated with the same layouts plans once
// and after that only enqueues. Reshard calls are collective and every rank passes the same layouts in the same
// order, so every rank finds, plans and evicts alike: a plan is created (collectively) on every rank or on none.
#pragma once

#include <cstddef>
#include <list>
#include <string>
#include <utility>
#include <vector>

#include "common/checks.h"
#include "nccl_m2n/include/nccl_m2n.h"

namespace ncclm2n {

constexpr size_t kReshardPlans = 8;

namespace keybytes {
template <typename T>
void put(std::string* k, const T& v) {
  k->append(reinterpret_cast<const char*>(&v), sizeof(T));
}
template <typename T>
void putArray(std::string* k, const T* p, size_t n) {
  put(k, (char)(p != nullptr));
  if (p) k->append(reinterpret_cast<const char*>(p), n * sizeof(T));
}
inline void putLayout(std::string* k, const ncclM2nLayout_t& l) {
  put(k, l.ndims);
  putArray(k, l.globalShape, (size_t)l.ndims);
  put(k, ncclext::storedInt(l.dtype));
  const ncclM2nMesh_t& m = *l.mesh;
  size_t positions = 1;
  for (int a = 0; a < m.ndims; a++) positions *= (size_t)m.dims[a];
  put(k, m.ndims);
  putArray(k, m.dims, (size_t)m.ndims);
  putArray(k, m.ranks, positions);
  putArray(k, l.boxes ? nullptr : l.placements, (size_t)m.ndims);  // ignored when boxes are given
  put(k, (char)(l.boxes != nullptr));
  for (size_t i = 0; l.boxes && i < positions; i++) {  // the first ndims entries of each box: the rest is unused
    putArray(k, l.boxes[i].offset, (size_t)l.ndims);
    putArray(k, l.boxes[i].shape, (size_t)l.ndims);
  }
  putArray(k, l.localStrides, positions * (size_t)l.ndims);
}
}  // namespace keybytes

// What a plan depends on, as bytes: both layouts in full (the tensor's name aside: it only names it in messages) and
// the config's fields. `spec` must have passed the batch's checks (its pointers are followed), `config` (NULL or) its
// size and magic check.
inline std::string reshardKey(const ncclM2nTensorSpec_t& spec, const ncclM2nExecConfig_t* config) {
  std::string k;
  keybytes::putLayout(&k, *spec.src);
  keybytes::putLayout(&k, *spec.dst);
  ncclM2nExecConfig_t c = NCCL_M2N_EXEC_CONFIG_INITIALIZER;
  if (config) c = *config;
  keybytes::put(&k, c.stagingBytes);
  keybytes::put(&k, c.timeoutSeconds);
  keybytes::put(&k, c.fp8BlockRows);
  keybytes::put(&k, c.lsa);
  keybytes::put(&k, c.zeroCopy);
  return k;
}

// The most recently used entries by key, at most `capacity`.
template <typename T>
class RecentPlans {
 public:
  explicit RecentPlans(size_t capacity = kReshardPlans) : capacity_(capacity) {}
  // The entry of `key`, now the most recent; nullptr if there is none.
  T* find(const std::string& key) {
    for (auto it = items_.begin(); it != items_.end(); ++it)
      if (it->first == key) {
        items_.splice(items_.begin(), items_, it);
        return &items_.front().second;
      }
    return nullptr;
  }
  // Adds `value` as the most recent; returns what no longer fits, oldest last, for the caller to free.
  std::vector<T> add(std::string key, T value) {
    items_.emplace_front(std::move(key), std::move(value));
    std::vector<T> out;
    while (items_.size() > capacity_) {
      out.push_back(std::move(items_.back().second));
      items_.pop_back();
    }
    return out;
  }
  // Removes `key`'s entry (true if there was one) into *out.
  bool take(const std::string& key, T* out) {
    for (auto it = items_.begin(); it != items_.end(); ++it)
      if (it->first == key) {
        *out = std::move(it->second);
        items_.erase(it);
        return true;
      }
    return false;
  }
  // Every entry, most recent first; the cache is then empty.
  std::vector<T> takeAll() {
    std::vector<T> out;
    for (auto& item : items_) out.push_back(std::move(item.second));
    items_.clear();
    return out;
  }
  size_t size() const { return items_.size(); }

 private:
  size_t capacity_;
  std::list<std::pair<std::string, T>> items_;
};

}  // namespace ncclm2n
