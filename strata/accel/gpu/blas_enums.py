"""cuBLAS's enum values for CuPy's raw bindings (cupy_backends.cuda.libs.cublas), shared by the dense products
(cuda_kernels.py) and the blocked prompt attention (cuda_attn.py)."""

OP_N, OP_T = 0, 1                   # cublasOperation_t
R_16F, R_32F = 2, 0                 # cudaDataType
COMPUTE_32F = 68                    # cublasComputeType_t CUBLAS_COMPUTE_32F
GEMM_DEFAULT = -1                   # cublasGemmAlgo_t CUBLAS_GEMM_DEFAULT
