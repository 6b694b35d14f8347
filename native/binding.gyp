# node-gyp build of the rlstream compute core: pure compute files (model, kernels, losses) plus thin N-API glue.
# CPU only by default. RLSTREAM_CUDA=1 in the environment adds the CUDA layer (cuda/*.cu through nvcc, cuBLAS,
# the cudart runtime; CUDA_HOME default /usr/local/cuda, RLSTREAM_CUDA_ARCH default sm_90); without it the build is
# the CPU build, unchanged.
{
  "variables": {
    "rlstream_cuda%": "<!(echo ${RLSTREAM_CUDA:-0})",
    "cuda_home%": "<!(echo ${CUDA_HOME:-/usr/local/cuda})",
    "cuda_arch%": "<!(echo ${RLSTREAM_CUDA_ARCH:-90})"
  },
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
        "src/glue_traces.cpp",
        "src/transcode.cpp",
        "src/native_block.cpp",
        "src/frames.cpp",
        "src/nccl_core.cpp",
        "src/nccl.cpp",
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
      "libraries": ["-lopenblas", "-fopenmp", "-lz", "-ldl"],
      "conditions": [
        ["rlstream_cuda==1", {
          "sources": ["cuda/cuda_kernels.cu", "cuda/weight_cache.cu", "cuda/graphs.cu", "cuda/elementwise.cu",
                      "cuda/optimizer.cu", "cuda/norms.cu", "cuda/rope.cu", "cuda/swiglu.cu", "cuda/softmax.cu",
                      "cuda/sampling.cu", "cuda/decode_attention.cu", "cuda/attention.cu"],
          "defines": ["RLSTREAM_CUDA"],
          "include_dirs": ["<(cuda_home)/include"],
          "rules": [
            {
              "rule_name": "nvcc",
              "extension": "cu",
              "inputs": ["<(RULE_INPUT_PATH)"],
              "outputs": ["<(INTERMEDIATE_DIR)/<(RULE_INPUT_ROOT).cu.o"],
              "action": ["<(cuda_home)/bin/nvcc", "-O3", "-std=c++17", "-Xcompiler", "-fPIC",
                         "-gencode=arch=compute_<(cuda_arch),code=sm_<(cuda_arch)",
                         "-c", "<(RULE_INPUT_PATH)", "-o", "<(INTERMEDIATE_DIR)/<(RULE_INPUT_ROOT).cu.o"],
              "process_outputs_as_sources": 1,
              "message": "nvcc <(RULE_INPUT_PATH)"
            }
          ],
          "libraries": ["-L<(cuda_home)/lib64", "-lcublas", "-lcudart", "-Wl,-rpath,<(cuda_home)/lib64"]
        }]
      ]
    }
  ]
}
