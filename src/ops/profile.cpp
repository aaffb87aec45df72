// Profile keys of op calls (bench --profile).
#include "ops/ops.h"

namespace dsv4 {

std::string op_profile_key(const char* op, const MatmulOp* mm, int64_t n_tokens) {
  std::string k = op;
  if (mm) {
    k += strfmt(" %s %lldx%lld", ggml_type_name(mm->w.type), static_cast<long long>(mm->w.n_rows()),
                static_cast<long long>(mm->w.ne[0]));
    if (mm->groups > 1) k += strfmt(" g%d", mm->groups);
    n_tokens = mm->x.n_rows();
  }
  if (n_tokens > 0) k += n_tokens == 1 ? " n=1" : " n>1";
  return k;
}

}  // namespace dsv4
