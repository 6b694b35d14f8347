# node-gyp build of the rlstream compute core: pure compute files (model, kernels, losses) plus thin N-API glue.
# CPU only by default; a CUDA layer would add its own target/sources implementing device.h.
{
  "targets": [
    {
      "target_name": "rlstream_native",
      "sources": [
        "src/config.cpp",
        "src/cpu_kernels.cpp",
        "src/model.cpp",
        "src/losses.cpp",
        "src/glue_model.cpp",
        "src/glue_misc.cpp",
        "src/addon.cpp"
      ],
      "include_dirs": [
        "<!(node -p \"require('node-addon-api').include_dir\")",
        "/usr/include/x86_64-linux-gnu/openblas-pthread"
      ],
      "defines": ["NAPI_VERSION=8", "NAPI_CPP_EXCEPTIONS"],
      "cflags!": ["-fno-exceptions"],
      "cflags_cc!": ["-fno-exceptions", "-fno-rtti"],
      "cflags_cc": ["-std=c++17", "-O3", "-march=native", "-fopenmp", "-fexceptions", "-Wall", "-Wextra", "-Wno-unused-parameter", "-fno-math-errno"],
      "ldflags": ["-fopenmp"],
      "libraries": ["-lopenblas", "-fopenmp"]
    }
  ]
}
