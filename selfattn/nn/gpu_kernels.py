"""The kernels attention_impl='pallas' may run on a CUDA GPU, by name
(pallas_attention's gpu_kernel, config.model.gpu_kernel): in a module of
their own so that a config is checked without loading Pallas."""

GPU_KERNELS = ('auto', 'cudnn', 'hopper', 'triton')
