// The addon's export list, and nothing else.
#include <napi.h>

#include "glue_misc.h"
#include "glue_model.h"

static Napi::Object Init(Napi::Env env, Napi::Object exports) {
  exports.Set("NativeModel", rls::ModelWrap::Init(env));
  exports.Set("sgemmGflops", Napi::Function::New(env, rls::SgemmGflops));
  exports.Set("backend", Napi::String::New(env, "cpu"));
  return exports;
}

NODE_API_MODULE(rlstream_native, Init)
