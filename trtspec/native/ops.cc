// The com.trtspec custom-op library's entry point: ONNX Runtime calls RegisterCustomOps when a session's options load
// the library (SessionOptions.register_custom_ops_library), and it adds the domain with every op of the library.
#include <string>

#include "op_support.h"

namespace trtspec_ops {
const OrtApi* g_api = nullptr;
}  // namespace trtspec_ops

using namespace trtspec_ops;

// Adds the domain com.trtspec with TreeAttention, PromptAttention, AddBlockOffsets, BlockMatMul and SkipRMSNorm to
// `options`. The
// domain lives as long as the process (sessions keep pointers to it).
extern "C" __attribute__((visibility("default"))) OrtStatus* RegisterCustomOps(OrtSessionOptions* options,
                                                                               const OrtApiBase* base) noexcept {
  const OrtApi* api = base->GetApi(kApiVersion);
  if (api == nullptr) {
    // CreateStatus is slot 0 of every version's table (upstream asserts it), so version 1's table can report this
    const OrtApi* v1 = base->GetApi(1);
    std::string text = std::string("trtspec's ops need ONNX Runtime API version ") + std::to_string(kApiVersion) +
                       " (1.17 or later); this is " + base->GetVersionString();
    return v1 ? v1->CreateStatus(ORT_FAIL, text.c_str()) : nullptr;
  }
  g_api = api;
  return guarded(kDomain, [&] {
    OrtCustomOpDomain* domain = nullptr;
    check(api->CreateCustomOpDomain(kDomain, &domain));
    for (const OrtCustomOp* op :
         {tree_attention_op(), prompt_attention_op(), add_block_offsets_op(), block_matmul_op(), skip_rms_norm_op()})
      check(api->CustomOpDomain_Add(domain, op));
    check(api->AddCustomOpDomain(options, domain));
  });
}
