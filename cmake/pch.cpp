// Compiles the precompiled LibTorch header once; see NOTE: [precompiled LibTorch].
