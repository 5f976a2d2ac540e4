// The library bench/kernel_timeline.py loads into a CUDA program (CUDA_INJECTION64_PATH): through
// CUPTI it records when the GPU ran each kernel, memset and copy (the nodes of replayed CUDA graphs
// too, each with the correlation id of the launch that issued it) and the correlation ids of the
// program's cudaProfilerStart / cudaProfilerStop calls, which mark the part to look at
// (bench/train_step marks its timed steps). At exit it writes them to $TANDEM_TIMELINE_OUT:
//
//   mark   start|stop  correlation
//   kernel|memset|memcpy  start_ns  end_ns  correlation  graph_id  name
//
// one record per line, tab-separated; a memset's name is "memset N B", a copy's "memcpy KIND N B".
// Unlike ncu, nothing is serialised or replayed: the times are those of the program's own run.
#include <cupti.h>

#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>
#include <vector>

namespace {

constexpr size_t kBufferBytes = 8u << 20;

struct Record {
  const char* kind;
  uint64_t start, end;
  uint32_t correlation, graph;
  std::string name;
};

std::mutex records_mutex;
std::vector<Record>* records = new std::vector<Record>();  // never freed: read by the exit handler
std::vector<std::pair<const char*, uint32_t>>* marks = new std::vector<std::pair<const char*, uint32_t>>();
CUpti_SubscriberHandle subscriber;

void CUPTIAPI buffer_requested(uint8_t** buffer, size_t* size, size_t* max_records) {
  *size = kBufferBytes;
  *buffer = static_cast<uint8_t*>(std::aligned_alloc(8, kBufferBytes));
  *max_records = 0;
}

const char* copy_kind(uint8_t kind) {
  switch (kind) {
    case CUPTI_ACTIVITY_MEMCPY_KIND_HTOD: return "HtoD";
    case CUPTI_ACTIVITY_MEMCPY_KIND_DTOH: return "DtoH";
    case CUPTI_ACTIVITY_MEMCPY_KIND_DTOD: return "DtoD";
    case CUPTI_ACTIVITY_MEMCPY_KIND_PTOP: return "PtoP";
    default: return "other";
  }
}

void CUPTIAPI buffer_completed(CUcontext, uint32_t, uint8_t* buffer, size_t, size_t valid) {
  std::lock_guard<std::mutex> lock(records_mutex);
  CUpti_Activity* activity = nullptr;
  while (cuptiActivityGetNextRecord(buffer, valid, &activity) == CUPTI_SUCCESS) {
    if (activity->kind == CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL || activity->kind == CUPTI_ACTIVITY_KIND_KERNEL) {
      const auto* k = reinterpret_cast<const CUpti_ActivityKernel10*>(activity);
      records->push_back({"kernel", k->start, k->end, k->correlationId, k->graphId, k->name ? k->name : "?"});
    } else if (activity->kind == CUPTI_ACTIVITY_KIND_MEMSET) {
      const auto* m = reinterpret_cast<const CUpti_ActivityMemset4*>(activity);
      records->push_back({"memset", m->start, m->end, m->correlationId, m->graphId,
                          "memset " + std::to_string(m->bytes) + " B"});
    } else if (activity->kind == CUPTI_ACTIVITY_KIND_MEMCPY) {
      const auto* m = reinterpret_cast<const CUpti_ActivityMemcpy6*>(activity);
      records->push_back({"memcpy", m->start, m->end, m->correlationId, m->graphId,
                          std::string("memcpy ") + copy_kind(m->copyKind) + " " + std::to_string(m->bytes) + " B"});
    }
  }
  std::free(buffer);
}

// cudaProfilerStart / Stop, on entry: the correlation ids around the marked part.
void CUPTIAPI on_runtime_call(void*, CUpti_CallbackDomain, CUpti_CallbackId id, const void* data) {
  const auto* info = static_cast<const CUpti_CallbackData*>(data);
  if (info->callbackSite != CUPTI_API_ENTER) return;
  const char* which = id == CUPTI_RUNTIME_TRACE_CBID_cudaProfilerStart_v4000 ? "start" : "stop";
  std::lock_guard<std::mutex> lock(records_mutex);
  marks->push_back({which, info->correlationId});
}

void write_records() {
  cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
  const char* path = std::getenv("TANDEM_TIMELINE_OUT");
  FILE* out = std::fopen(path != nullptr ? path : "kernel_timeline.tsv", "w");
  if (out == nullptr) {
    std::fprintf(stderr, "kernel_timeline: cannot write %s\n", path != nullptr ? path : "kernel_timeline.tsv");
    return;
  }
  std::lock_guard<std::mutex> lock(records_mutex);
  for (const auto& [which, correlation] : *marks) std::fprintf(out, "mark\t%s\t%u\n", which, correlation);
  for (const Record& r : *records) {
    std::fprintf(out, "%s\t%llu\t%llu\t%u\t%u\t%s\n", r.kind, static_cast<unsigned long long>(r.start),
                 static_cast<unsigned long long>(r.end), r.correlation, r.graph, r.name.c_str());
  }
  std::fclose(out);
}

bool check(CUptiResult result, const char* call) {
  if (result == CUPTI_SUCCESS) return true;
  const char* text = nullptr;
  cuptiGetResultString(result, &text);
  std::fprintf(stderr, "kernel_timeline: %s failed: %s\n", call, text != nullptr ? text : "?");
  return false;
}

}  // namespace

// Called by the CUDA driver when it loads this library. The driver may load it more than once in
// one process; the first load records.
extern "C" int InitializeInjection() {
  if (std::getenv("TANDEM_TIMELINE_ACTIVE") != nullptr) return 1;
  setenv("TANDEM_TIMELINE_ACTIVE", "1", 1);
  bool ok = check(cuptiActivityRegisterCallbacks(buffer_requested, buffer_completed), "cuptiActivityRegisterCallbacks");
  for (CUpti_ActivityKind kind :
       {CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL, CUPTI_ACTIVITY_KIND_MEMSET, CUPTI_ACTIVITY_KIND_MEMCPY}) {
    ok = ok && check(cuptiActivityEnable(kind), "cuptiActivityEnable");
  }
  ok = ok && check(cuptiSubscribe(&subscriber, on_runtime_call, nullptr), "cuptiSubscribe");
  for (CUpti_CallbackId id :
       {CUPTI_RUNTIME_TRACE_CBID_cudaProfilerStart_v4000, CUPTI_RUNTIME_TRACE_CBID_cudaProfilerStop_v4000}) {
    ok = ok && check(cuptiEnableCallback(1, subscriber, CUPTI_CB_DOMAIN_RUNTIME_API, id), "cuptiEnableCallback");
  }
  if (ok) std::atexit(write_records);
  return 1;
}
