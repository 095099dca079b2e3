// AdamW on a lookup table from its sparse gradient, in one pass over the table.
//
// lealla_tf.train.optimizers.FusedAdamW updated lealla_small's 501,153 x 128 token
// table with four full passes a step: the sparse gradient densified (a 256 MB
// zero tensor with the rows scattered in), the decoupled weight decay (read,
// multiply, write), and TensorFlow's fused Adam (read the table, both moments
// and the gradient, write all three). This op does the same arithmetic, term
// for term and in the same order as those ops, row by row in one pass: a row
// without a gradient is updated as with a zero gradient (its moments decay, as
// AdamW's dense update does). The rows are split among the process's cores:
// the table's update ends the training step, with nothing else left to run.
//
//   var -= (var * weight_decay) * lr
//   m   += (g - m) * (1 - beta1)
//   v   += (g * g - v) * (1 - beta2)
//   var -= (m * alpha) / (sqrt(v) + epsilon),
//   alpha = lr * sqrt(1 - beta2_power) / (1 - beta1_power)

#define EIGEN_USE_THREADS

#include <cmath>
#include <cstdint>
#include <system_error>
#include <thread>
#include <vector>

#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/resource_var.h"
#include "tensorflow/core/framework/shape_inference.h"
#include "tensorflow/core/kernels/training_op_helpers.h"
#include "unsupported/Eigen/CXX11/Tensor"

namespace lealla {
namespace {

using CPUDevice = Eigen::ThreadPoolDevice;
using tensorflow::DEVICE_CPU;
using tensorflow::OpKernel;
using tensorflow::OpKernelConstruction;
using tensorflow::OpKernelContext;
using tensorflow::Tensor;

struct Step {
  float lr, weight_decay, one_minus_beta1, one_minus_beta2, alpha, epsilon;
};

// One row of the update (the arithmetic of the header, in its order).
void UpdateRow(const Step step, const float* __restrict g, float* __restrict p,
               float* __restrict m, float* __restrict v, int64_t width) {
  const float lr = step.lr, decay = step.weight_decay, b1 = step.one_minus_beta1,
              b2 = step.one_minus_beta2, alpha = step.alpha, epsilon = step.epsilon;
  for (int64_t c = 0; c < width; ++c) {
    const float decayed = p[c] - (p[c] * decay) * lr;
    const float momentum = m[c] + (g[c] - m[c]) * b1;
    const float velocity = v[c] + (g[c] * g[c] - v[c]) * b2;
    p[c] = decayed - (momentum * alpha) / (std::sqrt(velocity) + epsilon);
    m[c] = momentum;
    v[c] = velocity;
  }
}

template <typename Index>
class SparseApplyAdamWOp : public OpKernel {
 public:
  explicit SparseApplyAdamWOp(OpKernelConstruction* context) : OpKernel(context) {
    OP_REQUIRES_OK(context, context->GetAttr("num_threads", &num_threads_));
  }

  void Compute(OpKernelContext* context) override {
    // Sparse access, as TensorFlow's own ResourceSparseApply* kernels: the step
    // gathers the table's rows (ResourceGather puts the variable in copy-on-read
    // mode), and a dense update of a copy-on-read variable copies the whole table
    // first (256 MB a step for LaBSE's vocabulary). Under the exclusive lock taken
    // here no read runs, so the buffer is updated in place.
    auto locks = tensorflow::MaybeLockVariableInputMutexesInOrder<CPUDevice, float>(
        context, /*do_lock=*/true, /*sparse=*/true, {0, 1, 2});
    Tensor var, m, v;
    OP_REQUIRES_OK(context, tensorflow::GetInputTensorFromVariable<CPUDevice, float>(
                                context, 0, true, true, &var));
    OP_REQUIRES_OK(context, tensorflow::GetInputTensorFromVariable<CPUDevice, float>(
                                context, 1, true, true, &m));
    OP_REQUIRES_OK(context, tensorflow::GetInputTensorFromVariable<CPUDevice, float>(
                                context, 2, true, true, &v));
    OP_REQUIRES(context, var.IsInitialized() && m.IsInitialized() && v.IsInitialized(),
                tensorflow::errors::FailedPrecondition("the variable or a moment is not "
                                                       "initialized"));
    OP_REQUIRES(context,
                var.dims() >= 1 && var.shape() == m.shape() && var.shape() == v.shape(),
                tensorflow::errors::InvalidArgument(
                    "var, m and v must share one shape of rank >= 1, got ",
                    var.shape().DebugString(), ", ", m.shape().DebugString(), ", ",
                    v.shape().DebugString()));
    const Tensor& indices = context->input(3);
    const Tensor& values = context->input(4);
    const int64_t rows = var.dim_size(0);
    const int64_t width = rows > 0 ? var.NumElements() / rows : 0;
    const int64_t given = indices.NumElements();
    OP_REQUIRES(context, indices.dims() == 1,
                tensorflow::errors::InvalidArgument("indices must be a vector"));
    OP_REQUIRES(context, values.dims() >= 1 && values.dim_size(0) == given &&
                             values.NumElements() == given * width,
                tensorflow::errors::InvalidArgument(
                    "values must hold one row of ", width, " values per index, got ",
                    values.shape().DebugString(), " for ", given, " indices"));
    float scalars[7];
    for (int i = 0; i < 7; ++i) {
      const Tensor& scalar = context->input(5 + i);
      OP_REQUIRES(context, scalar.NumElements() == 1,
                  tensorflow::errors::InvalidArgument("input ", 5 + i, " must be a scalar"));
      scalars[i] = scalar.flat<float>()(0);
    }
    const float lr = scalars[0], beta1_power = scalars[1], beta2_power = scalars[2];
    const float beta1 = scalars[3], beta2 = scalars[4], epsilon = scalars[5];
    const float weight_decay = scalars[6];
    const float alpha = lr * std::sqrt(1.0f - beta2_power) / (1.0f - beta1_power);
    const float one_minus_beta1 = 1.0f - beta1, one_minus_beta2 = 1.0f - beta2;

    // Row -> its gradient row; repeated indices are summed (as densifying does).
    const auto ids = indices.flat<Index>();
    const float* given_values = values.flat<float>().data();
    std::vector<int64_t> position(rows, -1);
    std::vector<float> summed;
    for (int64_t i = 0; i < given; ++i) {
      const int64_t row = static_cast<int64_t>(ids(i));
      OP_REQUIRES(context, row >= 0 && row < rows,
                  tensorflow::errors::InvalidArgument("index ", row, " is outside [0, ", rows,
                                                      ")"));
      if (position[row] < 0) {
        position[row] = i;
        continue;
      }
      if (summed.empty()) summed.assign(given_values, given_values + given * width);
      float* into = &summed[position[row] * width];
      for (int64_t c = 0; c < width; ++c) into[c] += given_values[i * width + c];
    }
    const float* gradient_rows = summed.empty() ? given_values : summed.data();

    const Step step{lr, weight_decay, one_minus_beta1, one_minus_beta2, alpha, epsilon};
    float* p = var.flat<float>().data();
    float* first = m.flat<float>().data();
    float* second = v.flat<float>().data();
    auto update = [&](int64_t begin, int64_t end) {
      const std::vector<float> zeros(width, 0.0f);
      for (int64_t r = begin; r < end; ++r) {
        const float* g = position[r] >= 0 ? gradient_rows + position[r] * width : zeros.data();
        UpdateRow(step, g, p + r * width, first + r * width, second + r * width, width);
      }
    };
    const int64_t threads =
        std::max<int64_t>(1, std::min<int64_t>(num_threads_, rows * width / (1 << 16)));
    std::vector<std::thread> workers;
    int64_t inline_from = threads;  // shares no thread could be started for run here
    for (int64_t k = 1; k < threads; ++k) {
      try {
        workers.emplace_back(update, rows * k / threads, rows * (k + 1) / threads);
      } catch (const std::system_error&) {  // e.g. a container's process limit
        inline_from = k;
        break;
      }
    }
    update(0, rows / threads);
    for (int64_t k = inline_from; k < threads; ++k) {
      update(rows * k / threads, rows * (k + 1) / threads);
    }
    for (auto& worker : workers) worker.join();
  }

 private:
  int64_t num_threads_;
};

REGISTER_OP("LeallaSparseApplyAdamW")
    .Input("var: resource")
    .Input("m: resource")
    .Input("v: resource")
    .Input("indices: Tindices")
    .Input("values: float")
    .Input("lr: float")
    .Input("beta1_power: float")
    .Input("beta2_power: float")
    .Input("beta1: float")
    .Input("beta2: float")
    .Input("epsilon: float")
    .Input("weight_decay: float")
    .Attr("Tindices: {int32, int64}")
    .Attr("num_threads: int >= 1 = 1")
    .SetIsStateful()
    .SetShapeFn(tensorflow::shape_inference::NoOutputs);

REGISTER_KERNEL_BUILDER(
    Name("LeallaSparseApplyAdamW").Device(DEVICE_CPU).TypeConstraint<int32_t>("Tindices"),
    SparseApplyAdamWOp<int32_t>);
REGISTER_KERNEL_BUILDER(
    Name("LeallaSparseApplyAdamW").Device(DEVICE_CPU).TypeConstraint<int64_t>("Tindices"),
    SparseApplyAdamWOp<int64_t>);

}  // namespace
}  // namespace lealla
