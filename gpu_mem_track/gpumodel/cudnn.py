"""cuDNN's convolution workspaces and ``torch.backends.cudnn.benchmark``'s trials, as
PyTorch allocates them. Torch-free.

The rules, from PyTorch's source (``aten/src/ATen/native/cudnn/Conv_v8.cpp``: ``run_single_conv``,
``run_conv_plan``, ``generate_and_filter_plans``, ``get_plans_from_find``; ``ConvShared.cpp``:
``cudnn_convolution_backward``) and the H200 recording ``timm-resnet50-amp`` (timm ResNet-50,
fp16 autocast, batch 128 at 288x288, ``cudnn.benchmark`` on, torch 2.11, cuDNN 9;
``../shared/fixtures/h200``), checked by ``tests/test_cudnn.py``:

1. **A workspace per convolution, freed inside it.** Each cuDNN convolution (forward,
   backward data, backward filter) allocates its plan's workspace through the caching
   allocator after its output exists and frees it when it returns (``run_conv_plan``:
   ``allocate(workspace_size)``, a ``DataPtr`` dropped at the end; size 0 allocates
   nothing). Trace: under ``_conv_forward``, the output, then one allocation freed before
   the next one (e.g. the stem's 424,698,384 B after its 339,738,624 B output).
2. **Backward order.** Data gradient first, then its workspace, then the weight gradient
   and its workspace (``cudnn_convolution_backward``); the trace's frameless backward
   allocates ``grad_input``, a workspace, ``grad_weight``, a workspace, in that order.
3. **Benchmark trials.** With ``cudnn.benchmark`` on, the first call of each key (the
   operation, shapes, strides, dtype, padding, stride, dilation, groups, ``deterministic``,
   ``allow_tf32``; the cache is per thread, so forward and autograd's backward thread keep
   their own) times the candidate plans in one trial workspace of the largest candidate's
   size among those that fit ``max(free device memory, largest cached block)``
   (``get_available_workspace``), halved while the allocation fails; frees it; calls
   ``emptyCache()`` (``_cudnn_get_conv_benchmark_empty_cache``, on by default), which
   releases every unused cached segment; then runs the fastest plan as in rule 1. Later
   calls of that key run the cached plan only. Trace: in the first iteration 23 forward
   keys and their backward keys each show a trial, then ``segment_free`` entries where a
   segment was unused, then the run's workspace; iterations 2 to 8 show the run's workspace only.
4. **Without benchmark**, cuDNN's heuristics pick the plan: no trial, no ``emptyCache``;
   the key's plan stays the one its first call chose, whatever ``benchmark`` says later.

The sizes are cuDNN's engine choices, which no rule derives; those of benchmarked plans
are fitted to the recording (X, Y, W: the convolution's input, output and weight bytes);
the spread quoted is the recorded sizes' over the model's 53 convolutions, forward and
backward:

- the run's workspace is X + Y (ratio to X + Y measured 1.00 to 1.22 forward and for data
  gradients), :data:`FILTER_FACTOR` x (X + Y) for weight gradients (1.00 to 1.59), except
  for pointwise convolutions (1x1, stride 1, no padding, one group): with at least
  :data:`DIRECT_POSITIONS` output positions per image their forward and data gradient
  take a few hundred bytes (272 B, 400 B: modelled as 0; one exception recorded, the
  1024-to-512 channel one at 18x18, took X + Y both ways), and with at least
  :data:`SPLIT_K_POSITIONS` their weight gradient takes :data:`SPLIT_K` x W (8,388,880 B
  for a 32,768 B weight);
- the trial workspace is X + Y for pointwise convolutions (measured 1.00 to 1.40) and
  :data:`TRIAL_FACTOR` x (X + Y) for the others (measured 1.03 to 2.95; the 7x7 stem 2.95).

These sizes are those of plans ``cudnn.benchmark`` chose (:func:`run_workspace`). A plan
chosen without it, by cuDNN's heuristics (torch's default), is another engine, sized by
:func:`heuristic_workspace`; the evidence is ``reports/gpu_check/H200/conv_workspaces.txt``
(``scripts/check/conv_workspaces.py`` on an H200, torch 2.11, cuDNN 9.19: the transient
allocations of the second training step of ``gpu_mem_track.examples.convnet``, batch 32,
3x32x32, in float32 (TF32 allowed, torch's default) and float16, NCHW and channels-last;
conv1 is 3 to 32 channels at 32x32, conv2 32 to 64 at 16x16, both 3x3, and conv1's input
needs no gradient). Its ``benchmark=True`` rows repeat the ``benchmark=False`` ones: the
plan cache's key (``ConvolutionParams``, ``ConvShared.h``) leaves ``benchmark`` out, so
they ran the cached heuristic plans. Each recorded allocation was mapped to its op by the
step's order (forward conv1, conv2; the last linear layer's backward copies its expanded
gradient twice, 1,280 B; conv2's data then weight gradient; conv1's weight gradient;
Adam's ``_foreach_sqrt`` list, freed last first: 40 B), and by the exact sums below.
Fitted on 5 problems x 4 configurations:

- **NCHW plans transform the layout.** With T = X + Y + W + :data:`LAYOUT_PAD` (the
  three tensors in the engines' NHWC layout), conv2 took T forward in float16 (1,609,744
  B) and for its data gradient in both dtypes (1,609,744 and 3,219,472 B: exact, 3
  points); forward in float32, X + W + 16 (1,122,320 B: exact, 1 point).
- **Channels-last plans need none** forward and for data gradients (conv1 and conv2
  forward in both dtypes, 4 points), and their weight gradient takes split sums, S =
  :data:`HEURISTIC_SPLIT` x W (conv2: 3,735,696 B in float32, 1.3% over S; 1,835,615 B in
  float16, 0.4% under; the list cannot tell the data gradient's entry from the weight
  gradient's, and is read as the weight gradient's, as NCHW below says). An NCHW weight
  gradient takes T + S in float16 (conv2: 3,445,359 B = 1,609,744 + 1,835,615 to 16 B) and
  :data:`FLOAT32_SPLIT` x W in float32 (conv2: 7,372,800 B, exact; no pad, so no
  transform). S is sized by the weight, not the batch, as split-K partial sums are: the
  one point cannot tell, but the gpu check's batch-256 float32 run of the same model
  (``reports/gpu_check/H200/report.md``, peak 191.35 MiB allocated) rules out sizes that
  grow with the batch: T + 1.18 (X + Y), which fits batch 32 as well, simulates it at
  216.74 MiB (+13.3%); these rules at 188.35 MiB (-1.6%), reserved 292 MiB (-0.7%).
- **Image stems** (at most :data:`STEM_CHANNELS` input channels per group: conv1) ran
  forward with none (4 points) and their weight gradient with none in float32 (2 points)
  and channels-last (61,663 B recorded in float16: modelled as none); NCHW float16 took
  3,642,283 B, modelled as T (37% under: 1 point, no rule found).

Which convolutions reach cuDNN at all is PyTorch's backend selection
(:mod:`~gpu_mem_track.gpumodel.convbackend`): most depthwise convolutions run PyTorch's own
kernel and take none of these workspaces. Those cuDNN does run (channels-last, float16
NCHW of 32 channels or more) take these rules, which treat them as stems (one input
channel per group): unrecorded.

Not modelled: channels-last, float32 and TF32-off plans chosen by benchmark (sized as the
ResNet's), TF32 off under the heuristics (sized as with it: no recording), cuDNN's errata and
the v8 plan cache's LRU limit, fused conv-add-ReLU, and the few-byte workspaces.
Deterministic mode only enters the key: its engines' sizes are unknown. Outside cuDNN, the
step also showed other kernels' scratch (the copies above; a channels-last max-pool
backward's contiguous copy of its gradient, 524,288 B; a 4 B semaphore of each
channels-last bias-gradient sum), listed in :mod:`~gpu_mem_track.gpumodel.differences`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from math import prod

__all__ = [
    "DIRECT_POSITIONS",
    "FILTER_FACTOR",
    "FLOAT32_SPLIT",
    "HEURISTIC_SPLIT",
    "KINDS",
    "LAYOUT_PAD",
    "SPLIT_K",
    "SPLIT_K_POSITIONS",
    "STEM_CHANNELS",
    "TRIAL_FACTOR",
    "ConvProblem",
    "CudnnConvolutions",
    "Step",
    "heuristic_workspace",
    "run_workspace",
    "trial_workspace",
]

#: The three cuDNN convolution operations, in ``cudnnBackendDescriptorType_t``'s terms.
KINDS = ("forward", "backward_data", "backward_filter")
#: Output positions per image from which a pointwise convolution runs with (almost) no
#: workspace: the recording's 1x1 convolutions at 18x18 (324) and larger took 272-400 B,
#: those at 9x9 (81) took X + Y.
DIRECT_POSITIONS = 18 * 18
#: Output positions per image from which a pointwise convolution's weight gradient sums
#: :data:`SPLIT_K` weight-sized partial results instead: the recording's at 36x36 (1,296)
#: and 72x72 did, those at 18x18 took X + Y (x 1.03).
SPLIT_K_POSITIONS = 36 * 36
#: How many weight-sized partial sums (8,388,880 B for a 32,768 B weight, 16,777,488 B
#: for 65,536 B, 67,109,136 B for 262,144 B).
SPLIT_K = 256
#: The weight gradient's workspace over X + Y (recorded: 1.00 to 1.59 over 22 distinct
#: problems, median 1.07; forward and data gradients: median 1.00).
FILTER_FACTOR = 1.07
#: The trial workspace of a non-pointwise convolution over X + Y (recorded: 1.03 to 2.95,
#: median 1.4).
TRIAL_FACTOR = 1.4
#: Bytes a heuristic NCHW plan's layout transform takes beyond X + Y + W (recorded: 16 B
#: in all 5 NCHW sizes that hold one; see the module doc).
LAYOUT_PAD = 16
#: A heuristic weight gradient's split sums, in weights (recorded on channels-last: 50.7 x
#: W in float32, 49.8 x W in float16, for one problem).
HEURISTIC_SPLIT = 50
#: The same on NCHW in float32, where no layout transform came with it (recorded:
#: 7,372,800 B = 100 x W, one problem).
FLOAT32_SPLIT = 100
#: Input channels per group up to which a convolution is an image stem (recorded: 3).
STEM_CHANNELS = 4


@dataclass(frozen=True)
class ConvProblem:
    """One convolution as cuDNN sees it: the forward problem's input, weight and output
    shapes (batch and channels first), its geometry and the element size in bytes.
    ``kind`` is one of :data:`KINDS`; ``flags`` are the key's other parts (strides,
    ``deterministic``, ``allow_tf32``, the thread), compared, not interpreted;
    ``channels_last``: cuDNN runs it in the NHWC (NDHWC) layout."""

    kind: str
    input_shape: tuple[int, ...]
    weight_shape: tuple[int, ...]
    output_shape: tuple[int, ...]
    stride: tuple[int, ...]
    padding: tuple[int, ...]
    dilation: tuple[int, ...]
    groups: int
    itemsize: int
    flags: tuple = ()
    channels_last: bool = False

    @property
    def input_bytes(self) -> int:
        return prod(self.input_shape) * self.itemsize

    @property
    def output_bytes(self) -> int:
        return prod(self.output_shape) * self.itemsize

    @property
    def weight_bytes(self) -> int:
        return prod(self.weight_shape) * self.itemsize

    @property
    def pointwise(self) -> bool:
        """1x1 kernel, stride 1, no padding, one group."""
        return (
            all(k == 1 for k in self.weight_shape[2:])
            and all(s == 1 for s in self.stride)
            and all(p == 0 for p in self.padding)
            and self.groups == 1
        )

    @property
    def positions(self) -> int:
        """Output positions per image (the product of the output's spatial sizes)."""
        return prod(self.output_shape[2:])

    @property
    def stem(self) -> bool:
        """At most :data:`STEM_CHANNELS` input channels per group (an image's)."""
        return self.input_shape[1] // max(self.groups, 1) <= STEM_CHANNELS


def run_workspace(problem: ConvProblem) -> int:
    """Bytes of the workspace a plan ``cudnn.benchmark`` chose allocates each call (the
    ResNet-50 rules of the module doc)."""
    both = problem.input_bytes + problem.output_bytes
    if problem.kind == "backward_filter":
        if problem.pointwise and problem.positions >= SPLIT_K_POSITIONS:
            return SPLIT_K * problem.weight_bytes
        return int(both * FILTER_FACTOR)
    if problem.pointwise and problem.positions >= DIRECT_POSITIONS:
        return 0
    return both


def heuristic_workspace(problem: ConvProblem) -> int:
    """Bytes of the workspace a plan cuDNN's heuristics chose (``cudnn.benchmark`` off at
    the key's first call) allocates each call: the convnet rules of the module doc."""
    x, y, w = problem.input_bytes, problem.output_bytes, problem.weight_bytes
    half = problem.itemsize <= 2
    transform = 0 if problem.channels_last else x + y + w + LAYOUT_PAD
    if problem.kind == "forward":
        if problem.stem or problem.channels_last:
            return 0
        return transform if half else x + w + LAYOUT_PAD
    if problem.kind == "backward_data":
        return transform
    if problem.stem:
        return transform if half else 0
    if not half and not problem.channels_last:
        return FLOAT32_SPLIT * w
    return transform + HEURISTIC_SPLIT * w


def trial_workspace(problem: ConvProblem) -> int:
    """Bytes of the benchmark trial's workspace (the largest candidate plan's)."""
    both = problem.input_bytes + problem.output_bytes
    return both if problem.pointwise else int(both * TRIAL_FACTOR)


@dataclass(frozen=True)
class Step:
    """One thing a convolution does to the allocator: ``"trial"`` (allocate ``nbytes``,
    halving while it fails, then free), ``"empty_cache"`` or ``"workspace"`` (allocate
    ``nbytes``, run, free)."""

    action: str
    nbytes: int = 0


@dataclass
class CudnnConvolutions:
    """The plan cache of one process: which keys have a plan, and whether
    ``cudnn.benchmark`` chose it (True) or cuDNN's heuristics (False); see the module doc."""

    planned: dict[ConvProblem, bool] = field(default_factory=dict)

    def steps(self, problem: ConvProblem, benchmark: bool, empty_cache: bool = True) -> list[Step]:
        """What ``problem``'s call does, in order: the trial and the cache release at the
        first call of its key under ``benchmark``, then the run's workspace, sized by how
        the key's plan was chosen at its first call (the key leaves ``benchmark`` out)."""
        steps = []
        if problem not in self.planned:
            self.planned[problem] = benchmark
            if benchmark:
                steps.append(Step("trial", trial_workspace(problem)))
                if empty_cache:
                    steps.append(Step("empty_cache"))
        benchmarked = self.planned[problem]
        workspace = run_workspace(problem) if benchmarked else heuristic_workspace(problem)
        if workspace:
            steps.append(Step("workspace", workspace))
        return steps
