// The part of ONNX Runtime's C ABI that trtspec's custom-op library uses, declared here because ONNX Runtime's
// headers ship with neither its Python wheel nor any package this project installs.
//
// Every layout below was read from ONNX Runtime's public sources (microsoft/onnxruntime, MIT):
//   include/onnxruntime/core/session/onnxruntime_c_api.h   (struct OrtApiBase, struct OrtApi, struct OrtCustomOp,
//                                                           the enums, each function's signature; read at API 30)
//   onnxruntime/core/session/onnxruntime_c_api.cc          (the table `ort_api_1_to_25`, in slot order, with
//                                                           upstream's own static_asserts of the last slot of each
//                                                           version: 101 for version 1 ... 275 for version 17)
//   onnxruntime/core/session/custom_ops.cc                 (which OrtCustomOp fields ONNX Runtime reads at which
//                                                           version: 8 characteristics, 13 input memory types,
//                                                           16 CreateKernelV2 / KernelComputeV2, 17 opset range and
//                                                           shape inference)
// Nothing is copied: the declarations are ours, the slot numbers are upstream's.
//
// The ABI is append-only: a slot keeps its index in every later release (the "Rules on how to add a new Ort API
// version" in onnxruntime_c_api.cc). So we declare OrtApi only up to the last slot we call, KernelContext_ParallelFor
// (slot 274, added in API version 17), ask OrtApiBase::GetApi for version 17 and run on ONNX Runtime >= 1.17
// (trtspec installs 1.32: API version 32, whose table begins with these same 275 slots).
#pragma once

#include <cstddef>
#include <cstdint>

namespace ort_abi {

// the API version whose table we declare (and request): the version that added our last slot
constexpr uint32_t kApiVersion = 17;

// ---- opaque handles ------------------------------------------------------------------------------------------------
struct OrtStatus;
struct OrtSessionOptions;
struct OrtCustomOpDomain;
struct OrtKernelInfo;
struct OrtKernelContext;
struct OrtValue;
struct OrtTypeInfo;
struct OrtTensorTypeAndShapeInfo;
struct OrtShapeInferContext;

// ---- enums (values as in onnxruntime_c_api.h) ----------------------------------------------------------------------
enum OrtErrorCode : int {
  ORT_OK = 0,
  ORT_FAIL = 1,
  ORT_INVALID_ARGUMENT = 2,
  ORT_RUNTIME_EXCEPTION = 6,
  ORT_INVALID_GRAPH = 10,
};

enum ONNXTensorElementDataType : int {
  ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED = 0,
  ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT = 1,
  ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT8 = 2,
  ONNX_TENSOR_ELEMENT_DATA_TYPE_INT32 = 6,
  ONNX_TENSOR_ELEMENT_DATA_TYPE_INT64 = 7,
  ONNX_TENSOR_ELEMENT_DATA_TYPE_BOOL = 9,
  ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16 = 10,
};

enum OrtCustomOpInputOutputCharacteristic : int {
  INPUT_OUTPUT_REQUIRED = 0,
  INPUT_OUTPUT_OPTIONAL = 1,
  INPUT_OUTPUT_VARIADIC = 2,
};

enum OrtMemType : int {
  OrtMemTypeCPUInput = -2,
  OrtMemTypeCPUOutput = -1,
  OrtMemTypeDefault = 0,
};

// ---- OrtApiBase: two slots, never versioned ------------------------------------------------------------------------
struct OrtApi;
struct OrtApiBase {
  const OrtApi* (*GetApi)(uint32_t version) noexcept;
  const char* (*GetVersionString)() noexcept;
};
static_assert(sizeof(OrtApiBase) == 2 * sizeof(void*), "OrtApiBase has exactly two slots");

// ---- OrtApi: slots 0..274 ------------------------------------------------------------------------------------------
// The slots we call, with their index in upstream's table (each one checked by a static_assert below):
//     0 CreateStatus                    61 GetDimensionsCount              93 ReleaseStatus
//     1 GetErrorCode                    62 GetDimensions                   98 ReleaseTypeInfo
//     2 GetErrorMessage                 65 GetTensorTypeAndShape           99 ReleaseTensorTypeAndShapeInfo
//    26 CreateCustomOpDomain            85 KernelInfoGetAttribute_float   230 KernelInfo_GetInputCount
//    27 CustomOpDomain_Add              86 KernelInfoGetAttribute_int64   234 KernelInfo_GetInputTypeInfo
//    28 AddCustomOpDomain               88 KernelContext_GetInputCount    274 KernelContext_ParallelFor
//    51 GetTensorMutableData            89 KernelContext_GetOutputCount
//    55 CastTypeInfoToTensorInfo        90 KernelContext_GetInput
//    60 GetTensorElementType            91 KernelContext_GetOutput
// Every other slot is an opaque placeholder; `unused_A_B` covers slots A..B inclusive.
using Status = OrtStatus*;

struct OrtApi {
  Status (*CreateStatus)(OrtErrorCode code, const char* msg) noexcept;                                 // 0
  OrtErrorCode (*GetErrorCode)(const OrtStatus* status) noexcept;                                      // 1
  const char* (*GetErrorMessage)(const OrtStatus* status) noexcept;                                    // 2
  void* unused_3_25[23];
  Status (*CreateCustomOpDomain)(const char* domain, OrtCustomOpDomain** out) noexcept;                // 26
  Status (*CustomOpDomain_Add)(OrtCustomOpDomain* domain, const struct OrtCustomOp* op) noexcept;      // 27
  Status (*AddCustomOpDomain)(OrtSessionOptions* options, OrtCustomOpDomain* domain) noexcept;         // 28
  void* unused_29_50[22];
  Status (*GetTensorMutableData)(OrtValue* value, void** out) noexcept;                                // 51
  void* unused_52_54[3];
  Status (*CastTypeInfoToTensorInfo)(const OrtTypeInfo* type_info,
                                     const OrtTensorTypeAndShapeInfo** out) noexcept;                  // 55
  void* unused_56_59[4];
  Status (*GetTensorElementType)(const OrtTensorTypeAndShapeInfo* info,
                                 ONNXTensorElementDataType* out) noexcept;                             // 60
  Status (*GetDimensionsCount)(const OrtTensorTypeAndShapeInfo* info, size_t* out) noexcept;          // 61
  Status (*GetDimensions)(const OrtTensorTypeAndShapeInfo* info, int64_t* dim_values,
                          size_t dim_values_length) noexcept;                                          // 62
  void* unused_63_64[2];
  Status (*GetTensorTypeAndShape)(const OrtValue* value, OrtTensorTypeAndShapeInfo** out) noexcept;   // 65
  void* unused_66_84[19];
  Status (*KernelInfoGetAttribute_float)(const OrtKernelInfo* info, const char* name, float* out) noexcept;  // 85
  Status (*KernelInfoGetAttribute_int64)(const OrtKernelInfo* info, const char* name,
                                         int64_t* out) noexcept;                                       // 86
  void* unused_87;
  Status (*KernelContext_GetInputCount)(const OrtKernelContext* context, size_t* out) noexcept;       // 88
  Status (*KernelContext_GetOutputCount)(const OrtKernelContext* context, size_t* out) noexcept;      // 89
  Status (*KernelContext_GetInput)(const OrtKernelContext* context, size_t index,
                                   const OrtValue** out) noexcept;                                     // 90
  Status (*KernelContext_GetOutput)(OrtKernelContext* context, size_t index, const int64_t* dim_values,
                                    size_t dim_count, OrtValue** out) noexcept;                        // 91
  void* unused_92;
  void (*ReleaseStatus)(OrtStatus* status) noexcept;                                                   // 93
  void* unused_94_97[4];
  void (*ReleaseTypeInfo)(OrtTypeInfo* info) noexcept;                                                 // 98
  void (*ReleaseTensorTypeAndShapeInfo)(OrtTensorTypeAndShapeInfo* info) noexcept;                     // 99
  void* unused_100_229[130];
  Status (*KernelInfo_GetInputCount)(const OrtKernelInfo* info, size_t* out) noexcept;                // 230
  void* unused_231_233[3];
  Status (*KernelInfo_GetInputTypeInfo)(const OrtKernelInfo* info, size_t index,
                                        OrtTypeInfo** type_info) noexcept;                             // 234
  void* unused_235_273[39];
  Status (*KernelContext_ParallelFor)(const OrtKernelContext* context, void (*fn)(void*, size_t), size_t total,
                                      size_t num_batch, void* user_data) noexcept;                     // 274
};

#define ORT_ABI_SLOT(name, index) \
  static_assert(offsetof(OrtApi, name) == (index) * sizeof(void*), #name " is slot " #index " of OrtApi")
ORT_ABI_SLOT(CreateStatus, 0);
ORT_ABI_SLOT(GetErrorCode, 1);
ORT_ABI_SLOT(GetErrorMessage, 2);
ORT_ABI_SLOT(CreateCustomOpDomain, 26);
ORT_ABI_SLOT(CustomOpDomain_Add, 27);
ORT_ABI_SLOT(AddCustomOpDomain, 28);
ORT_ABI_SLOT(GetTensorMutableData, 51);
ORT_ABI_SLOT(CastTypeInfoToTensorInfo, 55);
ORT_ABI_SLOT(GetTensorElementType, 60);
ORT_ABI_SLOT(GetDimensionsCount, 61);
ORT_ABI_SLOT(GetDimensions, 62);
ORT_ABI_SLOT(GetTensorTypeAndShape, 65);
ORT_ABI_SLOT(KernelInfoGetAttribute_float, 85);
ORT_ABI_SLOT(KernelInfoGetAttribute_int64, 86);
ORT_ABI_SLOT(KernelContext_GetInputCount, 88);
ORT_ABI_SLOT(KernelContext_GetOutputCount, 89);
ORT_ABI_SLOT(KernelContext_GetInput, 90);
ORT_ABI_SLOT(KernelContext_GetOutput, 91);
ORT_ABI_SLOT(ReleaseStatus, 93);
ORT_ABI_SLOT(ReleaseTypeInfo, 98);
ORT_ABI_SLOT(ReleaseTensorTypeAndShapeInfo, 99);
ORT_ABI_SLOT(KernelInfo_GetInputCount, 230);
ORT_ABI_SLOT(KernelInfo_GetInputTypeInfo, 234);
ORT_ABI_SLOT(KernelContext_ParallelFor, 274);
#undef ORT_ABI_SLOT
static_assert(sizeof(OrtApi) == 275 * sizeof(void*), "OrtApi is declared up to slot 274, no further");

// ---- OrtCustomOp ---------------------------------------------------------------------------------------------------
// Declared with every field of the struct as of API 30 (25 function pointers after `version`), so that a reader of
// any later field finds a null pointer, not memory past our object. We set `version` to kApiVersion (17), and ONNX
// Runtime reads only the fields of that version: CreateKernelV2 / KernelComputeV2 (16), and GetStartVersion /
// GetEndVersion / InferOutputShapeFn (17; left null: opset 1, output types from the declared element types).
struct OrtCustomOp {
  uint32_t version;
  void* (*CreateKernel)(const OrtCustomOp* op, const OrtApi* api, const OrtKernelInfo* info) noexcept;  // 1
  const char* (*GetName)(const OrtCustomOp* op) noexcept;                                                // 2
  const char* (*GetExecutionProviderType)(const OrtCustomOp* op) noexcept;                               // 3
  ONNXTensorElementDataType (*GetInputType)(const OrtCustomOp* op, size_t index) noexcept;               // 4
  size_t (*GetInputTypeCount)(const OrtCustomOp* op) noexcept;                                           // 5
  ONNXTensorElementDataType (*GetOutputType)(const OrtCustomOp* op, size_t index) noexcept;              // 6
  size_t (*GetOutputTypeCount)(const OrtCustomOp* op) noexcept;                                          // 7
  void (*KernelCompute)(void* kernel, OrtKernelContext* context) noexcept;                               // 8
  void (*KernelDestroy)(void* kernel) noexcept;                                                          // 9
  OrtCustomOpInputOutputCharacteristic (*GetInputCharacteristic)(const OrtCustomOp* op,
                                                                 size_t index) noexcept;                 // 10
  OrtCustomOpInputOutputCharacteristic (*GetOutputCharacteristic)(const OrtCustomOp* op,
                                                                  size_t index) noexcept;                // 11
  OrtMemType (*GetInputMemoryType)(const OrtCustomOp* op, size_t index) noexcept;                        // 12
  int (*GetVariadicInputMinArity)(const OrtCustomOp* op) noexcept;                                       // 13
  int (*GetVariadicInputHomogeneity)(const OrtCustomOp* op) noexcept;                                    // 14
  int (*GetVariadicOutputMinArity)(const OrtCustomOp* op) noexcept;                                      // 15
  int (*GetVariadicOutputHomogeneity)(const OrtCustomOp* op) noexcept;                                   // 16
  Status (*CreateKernelV2)(const OrtCustomOp* op, const OrtApi* api, const OrtKernelInfo* info,
                           void** kernel) noexcept;                                                      // 17
  Status (*KernelComputeV2)(void* kernel, OrtKernelContext* context) noexcept;                           // 18
  Status (*InferOutputShapeFn)(const OrtCustomOp* op, OrtShapeInferContext* context) noexcept;           // 19
  int (*GetStartVersion)(const OrtCustomOp* op) noexcept;                                                // 20
  int (*GetEndVersion)(const OrtCustomOp* op) noexcept;                                                  // 21
  size_t (*GetMayInplace)(int** input_index, int** output_index) noexcept;                               // 22
  void (*ReleaseMayInplace)(int* input_index, int* output_index) noexcept;                               // 23
  size_t (*GetAliasMap)(int** input_index, int** output_index) noexcept;                                 // 24
  void (*ReleaseAliasMap)(int* input_index, int* output_index) noexcept;                                 // 25
};
static_assert(offsetof(OrtCustomOp, CreateKernel) == sizeof(void*), "version is padded to one pointer");
static_assert(offsetof(OrtCustomOp, CreateKernelV2) == 17 * sizeof(void*), "CreateKernelV2 is field 17");
static_assert(offsetof(OrtCustomOp, GetEndVersion) == 21 * sizeof(void*), "GetEndVersion is field 21");
static_assert(sizeof(OrtCustomOp) == 26 * sizeof(void*), "OrtCustomOp: version + 25 function pointers");

}  // namespace ort_abi
