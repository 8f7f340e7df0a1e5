// Operator schemas of torch.ops.megatron_gamma and the Python module megatron_gamma._C.
//
// Importing megatron_gamma._C (after torch) runs the static registrations of this library:
// the schemas below, the CPU kernels (cpu_kernels.cpp) and, in a CUDA build, the CUDA kernels
// (cuda_kernels.cu). Autograd formulas and fake (meta) kernels are registered in Python by
// megatron_gamma/ops/_fused.py.
#include <Python.h>

#include <torch/library.h>

#ifndef MG_WITH_CUDA
#define MG_WITH_CUDA 0
#endif

TORCH_LIBRARY(megatron_gamma, m) {
  // y, rstd = rms_norm_fwd(x, weight, eps, zcg): x (..., hidden), weight (hidden,);
  // y like x (contiguous), rstd (...) fp32 (fp64 for fp64 x) = 1 / sqrt(mean(x^2) + eps).
  m.def(
      "rms_norm_fwd(Tensor x, Tensor weight, float eps, bool zero_centered_gamma)"
      " -> (Tensor, Tensor)",
      {at::Tag::pt2_compliant_tag});
  // dx, dweight = rms_norm_bwd(dy, x, weight, rstd, zcg): dx like x, dweight like weight
  // (reduced over all rows in fp32/fp64, then cast to weight's dtype).
  m.def(
      "rms_norm_bwd(Tensor dy, Tensor x, Tensor weight, Tensor rstd, bool zero_centered_gamma)"
      " -> (Tensor, Tensor)",
      {at::Tag::pt2_compliant_tag});
  // y = o * sigmoid(g): g has o's shape (elementwise) or o's shape without the last dimension
  // (headwise, broadcast over head_dim).
  m.def("sigmoid_gate_fwd(Tensor o, Tensor g) -> Tensor", {at::Tag::pt2_compliant_tag});
  // do, dg = sigmoid_gate_bwd(dy, o, g).
  m.def("sigmoid_gate_bwd(Tensor dy, Tensor o, Tensor g) -> (Tensor, Tensor)",
        {at::Tag::pt2_compliant_tag});
  // counter_normal_(out, start, stride, key, sigma): fills out (rows, width), contiguous, with
  // the gamma-init's counter-based N(0, sigma^2) values of global elements
  // start + r * stride + c (megatron_gamma/model/counter_rng.py; CPU only).
  m.def("counter_normal_(Tensor(a!) out, int start, int stride, int key, float sigma) -> ()");
  // moments(x) -> float64 [sum, sum of squares] of every element of contiguous x (CPU only).
  m.def("moments(Tensor x) -> Tensor");
  // counts, status, unclassified = token_document_stats(ids, offsets, table, classes,
  // extra_values, extra_classes): (D, 4) int64 [Han characters, Latin words, visible
  // characters, tokens holding a control character] of each document
  // ids[offsets[d]:offsets[d + 1]] of the int32 ids, from the (8, V) int64 vocabulary table and
  // the classes of code points (uint8 below len(classes), then extra_values -> extra_classes) of
  // megatron_gamma/data/token_stats.py; status 0, 4 with the code points it could not classify,
  // or why the ids are not UTF-8 (CPU only, one thread).
  m.def(
      "token_document_stats(Tensor ids, Tensor offsets, Tensor table, Tensor classes,"
      " Tensor extra_values, Tensor extra_classes) -> (Tensor, int, Tensor)");
}

static struct PyModuleDef mg_module = {
    PyModuleDef_HEAD_INIT,
    "_C",
    "megatron-gamma kernels; importing registers torch.ops.megatron_gamma.*",
    -1,
    nullptr,
};

PyMODINIT_FUNC PyInit__C(void) {
  PyObject* module = PyModule_Create(&mg_module);
  if (module != nullptr && PyModule_AddIntConstant(module, "with_cuda", MG_WITH_CUDA) < 0) {
    Py_DECREF(module);
    return nullptr;
  }
  return module;
}
