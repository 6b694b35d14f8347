// N-API glue for the trace sink's Avro → RowBinary transcoder (declarations).
#pragma once
#include <napi.h>

namespace rls {
Napi::Value Transcode(const Napi::CallbackInfo& info);
}
