
import triton
import triton.language as tl

from torch._inductor.runtime import triton_helpers, triton_heuristics
from torch._inductor.runtime.triton_helpers import libdevice, math as tl_math
from torch._inductor.runtime.hints import AutotuneHint, ReductionHint, TileHint, DeviceProperties
triton_helpers.set_driver_to_gpu()

@triton_heuristics.pointwise(
    size_hints={'x': 33554432}, 
    filename=__file__,
    triton_meta={'signature': {'in_out_ptr1': '*bf16', 'in_ptr0': '*fp32', 'in_ptr1': '*fp32', 'in_ptr2': '*fp32', 'in_ptr3': '*bf16', 'in_ptr4': '*bf16', 'in_ptr5': '*bf16', 'xnumel': 'i32', 'XBLOCK': 'constexpr'}, 'device': DeviceProperties(type='cuda', index=0, multi_processor_count=132, cc=90, major=9, regs_per_multiprocessor=65536, max_threads_per_multi_processor=2048, max_threads_per_block=1024, warp_size=32), 'constants': {}, 'native_matmul': False, 'enable_fp_fusion': True, 'launch_pdl': False, 'disable_ftz': False, 'configs': [{(0,): [['tt.divisibility', 16]], (1,): [['tt.divisibility', 16]], (2,): [['tt.divisibility', 16]], (3,): [['tt.divisibility', 16]], (4,): [['tt.divisibility', 16]], (5,): [['tt.divisibility', 16]], (6,): [['tt.divisibility', 16]], (7,): [['tt.divisibility', 16]]}]},
    inductor_meta={'grid_type': 'Grid1D', 'autotune_hints': set(), 'kernel_name': 'triton_poi_fused__softmax_backward_data__to_copy_add_mul_select_unsqueeze_15', 'mutated_arg_names': ['in_out_ptr1'], 'optimize_mem': True, 'no_x_dim': False, 'atomic_add_found': False, 'num_load': 28, 'num_store': 1, 'num_reduction': 0, 'backend_hash': '91D1D1166449D9E2EB66EB9770C9E2C3B0FEB787341F27FEB4D3F0338DA50336', 'assert_indirect_indexing': True, 'autotune_local_cache': True, 'autotune_pointwise': True, 'autotune_remote_cache': None, 'force_disable_caches': False, 'dynamic_scale_rblock': True, 'max_autotune': False, 'max_autotune_pointwise': False, 'min_split_scan_rblock': 256, 'spill_threshold': 16, 'store_cubin': False, 'deterministic': False, 'force_filter_reduction_configs': False, 'mix_order_reduction_allow_multi_stages': False, 'are_deterministic_algorithms_enabled': False, 'tiling_scores': {'x': 268500992}},
    min_elem_per_thread=0
)
@triton.jit
def triton_poi_fused__softmax_backward_data__to_copy_add_mul_select_unsqueeze_15(in_out_ptr1, in_ptr0, in_ptr1, in_ptr2, in_ptr3, in_ptr4, in_ptr5, xnumel, XBLOCK : tl.constexpr):
    xnumel = 33554432
    xoffset = tl.program_id(0) * XBLOCK
    xindex = xoffset + tl.arange(0, XBLOCK)[:]
    xmask = tl.full([XBLOCK], True, tl.int1)[:]
    x1 = xindex // 4096
    x0 = (xindex % 4096)
    x2 = xindex
    tmp0 = tl.load(in_ptr0 + (8*x1), None, eviction_policy='evict_last')
    tmp2 = tl.load(in_ptr1 + (x1), None, eviction_policy='evict_last')
    tmp3 = tl.load(in_ptr2 + (8*x1), None, eviction_policy='evict_last')
    tmp6 = tl.load(in_ptr3 + (x0), None, eviction_policy='evict_last').to(tl.float32)
    tmp11 = tl.load(in_ptr0 + (1 + 8*x1), None, eviction_policy='evict_last')
    tmp13 = tl.load(in_ptr2 + (1 + 8*x1), None, eviction_policy='evict_last')
    tmp16 = tl.load(in_ptr3 + (4096 + x0), None, eviction_policy='evict_last').to(tl.float32)
    tmp20 = tl.load(in_ptr0 + (2 + 8*x1), None, eviction_policy='evict_last')
    tmp22 = tl.load(in_ptr2 + (2 + 8*x1), None, eviction_policy='evict_last')
    tmp25 = tl.load(in_ptr3 + (8192 + x0), None, eviction_policy='evict_last').to(tl.float32)
    tmp29 = tl.load(in_ptr0 + (3 + 8*x1), None, eviction_policy='evict_last')
    tmp31 = tl.load(in_ptr2 + (3 + 8*x1), None, eviction_policy='evict_last')
    tmp34 = tl.load(in_ptr3 + (12288 + x0), None, eviction_policy='evict_last').to(tl.float32)
    tmp38 = tl.load(in_ptr0 + (4 + 8*x1), None, eviction_policy='evict_last')
    tmp40 = tl.load(in_ptr2 + (4 + 8*x1), None, eviction_policy='evict_last')
    tmp43 = tl.load(in_ptr3 + (16384 + x0), None, eviction_policy='evict_last').to(tl.float32)
    tmp47 = tl.load(in_ptr0 + (5 + 8*x1), None, eviction_policy='evict_last')
    tmp49 = tl.load(in_ptr2 + (5 + 8*x1), None, eviction_policy='evict_last')
    tmp52 = tl.load(in_ptr3 + (20480 + x0), None, eviction_policy='evict_last').to(tl.float32)
    tmp56 = tl.load(in_out_ptr1 + (x2), None).to(tl.float32)
    tmp57 = tl.load(in_ptr4 + (x2), None).to(tl.float32)
    tmp59 = tl.load(in_ptr5 + (x2), None).to(tl.float32)
    tmp61 = tl.load(in_ptr0 + (6 + 8*x1), None, eviction_policy='evict_last')
    tmp63 = tl.load(in_ptr2 + (6 + 8*x1), None, eviction_policy='evict_last')
    tmp66 = tl.load(in_ptr3 + (24576 + x0), None, eviction_policy='evict_last').to(tl.float32)
    tmp70 = tl.load(in_ptr0 + (7 + 8*x1), None, eviction_policy='evict_last')
    tmp72 = tl.load(in_ptr2 + (7 + 8*x1), None, eviction_policy='evict_last')
    tmp75 = tl.load(in_ptr3 + (28672 + x0), None, eviction_policy='evict_last').to(tl.float32)
    tmp1 = -tmp0
    tmp4 = tmp3 * tmp0
    tmp5 = tl.fma(tmp1, tmp2, tmp4)
    tmp7 = tmp6.to(tl.float32)
    tmp8 = tmp5 * tmp7
    tmp9 = tl.full([1], 0.0, tl.float32)
    tmp10 = tmp8 + tmp9
    tmp12 = -tmp11
    tmp14 = tmp13 * tmp11
    tmp15 = tl.fma(tmp12, tmp2, tmp14)
    tmp17 = tmp16.to(tl.float32)
    tmp18 = tmp15 * tmp17
    tmp19 = tmp10 + tmp18
    tmp21 = -tmp20
    tmp23 = tmp22 * tmp20
    tmp24 = tl.fma(tmp21, tmp2, tmp23)
    tmp26 = tmp25.to(tl.float32)
    tmp27 = tmp24 * tmp26
    tmp28 = tmp19 + tmp27
    tmp30 = -tmp29
    tmp32 = tmp31 * tmp29
    tmp33 = tl.fma(tmp30, tmp2, tmp32)
    tmp35 = tmp34.to(tl.float32)
    tmp36 = tmp33 * tmp35
    tmp37 = tmp28 + tmp36
    tmp39 = -tmp38
    tmp41 = tmp40 * tmp38
    tmp42 = tl.fma(tmp39, tmp2, tmp41)
    tmp44 = tmp43.to(tl.float32)
    tmp45 = tmp42 * tmp44
    tmp46 = tmp37 + tmp45
    tmp48 = -tmp47
    tmp50 = tmp49 * tmp47
    tmp51 = tl.fma(tmp48, tmp2, tmp50)
    tmp53 = tmp52.to(tl.float32)
    tmp54 = tmp51 * tmp53
    tmp55 = tmp46 + tmp54
    tmp58 = tmp56 + tmp57
    tmp60 = tmp58 + tmp59
    tmp62 = -tmp61
    tmp64 = tmp63 * tmp61
    tmp65 = tl.fma(tmp62, tmp2, tmp64)
    tmp67 = tmp66.to(tl.float32)
    tmp68 = tmp65 * tmp67
    tmp69 = tmp55 + tmp68
    tmp71 = -tmp70
    tmp73 = tmp72 * tmp70
    tmp74 = tl.fma(tmp71, tmp2, tmp73)
    tmp76 = tmp75.to(tl.float32)
    tmp77 = tmp74 * tmp76
    tmp78 = tmp69 + tmp77
    tmp79 = tmp78.to(tl.float32)
    tmp80 = tmp60 + tmp79
    tl.store(in_out_ptr1 + (x2), tmp80, None)
