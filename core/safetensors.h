#pragma once
// The safetensors format (https://github.com/huggingface/safetensors), readable by Python's
// `safetensors`, PyTorch and Hugging Face tools:
//
//   [8 bytes]  N, the header length, little-endian u64
//   [N bytes]  a JSON object: name -> {"dtype": "F32", "shape": [2, 3], "data_offsets": [begin, end]},
//              plus an optional "__metadata__": {string: string}; padded with spaces to a multiple of 8
//   [rest]     the tensors' raw little-endian bytes; offsets count from the start of this section
//
// Files written here lay the tensors out in sorted name order. Loading checks everything the
// reference implementation checks (and duplicate names, which it lets through) and throws a
// ValueError naming the file and what is wrong.
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "tandem/core/tensor.h"

namespace tandem {

struct SafetensorsFile {
  std::vector<std::string> names;               // in file order (by data offset)
  std::map<std::string, Tensor> tensors;        // contiguous, on the cpu
  std::map<std::string, std::string> metadata;  // "__metadata__", empty when absent

  // The tensor called `name`; a ValueError listing what the file holds when there is none.
  const Tensor& at(const std::string& name) const;
  bool contains(const std::string& name) const { return tensors.count(name) != 0; }
};

// Writes `tensors` (any device, dtype of tandem's, layout) as a safetensors file. The bytes go to
// `path + ".tmp.<pid>"`, are flushed to disk, and the temporary file is then renamed over `path`
// (and the directory synced), so `path` holds either the old file or the complete new one.
// Temporary files of `path` left by killed processes are removed first, and SIGINT or SIGTERM
// during the write removes this one (core/temp_files.h). Names must be unique and not "__metadata__". OS failures throw a BackendError.
void save_safetensors(const std::string& path, const std::vector<std::pair<std::string, Tensor>>& tensors,
                      const std::map<std::string, std::string>& metadata = {});
void save_safetensors(const std::string& path, const std::map<std::string, Tensor>& tensors,
                      const std::map<std::string, std::string>& metadata = {});
// Lets save_safetensors(path, {{"w", w}, {"b", b}}) pick an overload.
void save_safetensors(const std::string& path, std::initializer_list<std::pair<std::string, Tensor>> tensors,
                      const std::map<std::string, std::string>& metadata = {});
SafetensorsFile load_safetensors(const std::string& path);

// The same format in memory: what save_safetensors writes, and a parser for a complete file's
// bytes (`source` names it in error messages).
std::vector<uint8_t> serialize_safetensors(const std::vector<std::pair<std::string, Tensor>>& tensors,
                                           const std::map<std::string, std::string>& metadata = {});
SafetensorsFile parse_safetensors(const uint8_t* data, size_t size, const std::string& source = "<buffer>");

// Format names: "F32" <-> DType::f32, ..., "BOOL" <-> DType::boolean. The parser throws a
// ValueError for a dtype tandem does not hold (I8, U16, F8_E4M3, ...).
const char* safetensors_dtype_name(DType dtype);

}  // namespace tandem
