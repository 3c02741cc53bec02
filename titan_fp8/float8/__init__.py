"""Low-precision training layer: float8 linears (tensorwise, rowwise, blockwise, mxfp8) with FSDP2 float8
all-gather and one combined AMAX all-reduce. Public API:

    Float8Config, convert_to_float8_training, precompute_float8_dynamic_scale_for_fsdp
"""
from .config import RECIPES, Float8Config
from .convert import check_float8_all_gather, convert_to_float8_training
from .linear import Float8Linear
from .precompute import precompute_float8_dynamic_scale_for_fsdp
from .weights import Float8TrainingWeight, batch_weight_casts

__all__ = ["Float8Config", "convert_to_float8_training", "precompute_float8_dynamic_scale_for_fsdp",
           "Float8Linear", "Float8TrainingWeight", "RECIPES", "check_float8_all_gather",
           "batch_weight_casts"]
