"""What schedhub is compared with: numpy and PyTorch equivalents of kernels, and the engines a user would run a model
on instead (PyTorch, Inductor, ONNX Runtime, OpenVINO), each in a process of its own that never imports TVM. The top
layer below the worker and the demo."""
