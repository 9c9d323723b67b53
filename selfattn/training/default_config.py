"""selfattn's default config: every field training reads, with its default
and what it means (2-layer sinusoidal encoder reversing strings).

It lives in the package so that a project that pip-installs selfattn can
start its own config file from it:

  from selfattn.training import default_config

  def get_config(arg=None):
    config = default_config.get_config(arg)
    config.model.position = 'shaw'
    return config

configs/default.py, the checkout's command-line entry, is this config.
"""

import ml_collections
from ml_collections import config_dict

from selfattn.nn import positions
from selfattn import tasks


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  """The default config. `arg` (what follows ':' in --config=FILE:ARG) is
  refused: this config has no scales, and one silently ignored would run
  another experiment than the command says (configs/chomsky.py,
  indirect_indexing.py, music.py and translation.py take theirs)."""
  if arg:
    raise ValueError(f'this config takes no scale or argument after ":"; '
                     f'got {arg!r} (configs with scales: chomsky, '
                     f'indirect_indexing, music, translation)')
  config = ml_collections.ConfigDict()
  config.seed = 0                      # parameters, data and dropout all derive from it

  config.task = ml_collections.ConfigDict()
  config.task.name = 'reverse'         # see docs/training.md's task table / selfattn/tasks/registry.py
  # Data symbols (None: the task's default: 8; indirect_indexing 52 letters;
  # multi30k* the SentencePiece vocabulary, 8000); the suite's tasks and
  # jsb_chorales have a fixed alphabet.
  config.task.vocab_size = config_dict.placeholder(int)
  config.task.layout = 'in_place'      # in_place, placeholders (the suite's reference layout), autoregressive (a causal decoder) or encoder_decoder (translation)
  config.task.min_len = 1              # training lengths, uniform in [min_len, max_len] (>= 2 for precedes and indirect_indexing, 4 for jsb_chorales)
  config.task.max_len = 16
  config.task.per_batch_length = False  # True: one length per batch, as the reference does
  # Task options (shift: k of `shift`; window: w of `window_sum`; max_shift:
  # the largest |shift| of `indirect_indexing`; transpose, crop_align,
  # eval_split: the music task's), from selfattn.tasks.DEFAULT_OPTIONS, the one list; a task
  # refuses another's option set away from its default (TaskSpec.options).
  _add_options(config.task, 'task', tasks.DEFAULT_OPTIONS)

  config.model = ml_collections.ConfigDict()
  config.model.position = 'sinusoidal'  # none, sinusoidal, learned, shaw, huang, rope, pope, alibi, t5, xl
  config.model.num_layers = 2
  config.model.num_hiddens = 64
  config.model.num_heads = 4
  config.model.ffn_num_hiddens = 128
  config.model.dropout = 0.0
  config.model.norm = 'pre'             # post (the chapter), pre, none
  config.model.norm_type = 'layernorm'  # layernorm (the chapter) or rmsnorm
  config.model.residual = True          # False removes the skip connections
  config.model.max_len = 256            # rows of learned/huang/xl tables; >= longest eval sequence (and translation pair)
  config.model.dtype = 'float32'        # activations: float32 or bfloat16 (params stay float32)
  config.model.attention_impl = 'plain'  # or fused (cuDNN on GPUs in bfloat16), chunked (O(L) memory), auto, pallas (flash kernels)
  # With attention_impl='pallas' on a CUDA GPU: auto (selfattn's choice per
  # call), or insist on triton, hopper (sm90, bfloat16) or cudnn (no logit
  # term, bfloat16). The kernels run only on a GPU, but validation refuses,
  # anywhere, a choice the model could not use (and cudnn without a GPU).
  config.model.gpu_kernel = 'auto'
  config.model.remat = False            # recompute block activations in the backward pass
  config.model.scan_layers = False      # stacked blocks run by nnx.scan (compile time flat in depth)
  # A learned embedding of the step phase, (position // meter_step_tokens) %
  # meter_period, added to every token (0: off; the music study's meter
  # rows use 16 steps of 4 tokens, with bar-aligned crops).
  config.model.meter_period = 0
  config.model.meter_step_tokens = 4
  # Translation (encoder_decoder layout): one token table for the encoder's
  # input and the decoder's input and output (a joint vocabulary).
  config.model.tie_embeddings = False
  # Randomized positional encodings (Ruoss et al. 2023): positions are a sorted
  # random subset of [0, max_random_len), drawn per example in training and eval.
  config.model.randomize_positions = False
  config.model.max_random_len = config_dict.placeholder(int)  # >= longest sequence
  # Options of individual encodings (docs/library.md's encoding table lists them with
  # their defaults); None means the encoding's own default. The list comes from
  # selfattn.nn.positions.POSITIONS, so a new encoding's options appear here.
  _add_options(config.model, 'model', {
      name: config_dict.placeholder(kind)
      for name, kind in positions.option_types().items()})

  config.train = ml_collections.ConfigDict()
  config.train.num_steps = 2000
  config.train.batch_size = 64           # global batch, split over the `data` mesh axis
  # Translation's length-bucketed batches: about this many (padded) tokens a
  # batch, whatever the bucket (0: batch_size x the longest bucket's length).
  config.train.batch_tokens = 0
  config.train.learning_rate = 3e-3      # peak, after linear warmup; cosine decay to 0
  config.train.warmup_steps = 100
  config.train.schedule = 'cosine'       # cosine (decay at num_steps to final_lr_fraction of the peak) or constant
  config.train.final_lr_fraction = 0.0   # cosine's end: 0.1 decays to a tenth of the peak
  config.train.b2 = 0.999                # AdamW's second-moment decay
  config.train.weight_decay = 0.01       # AdamW, matrices only
  config.train.grad_clip = 1.0           # global-norm clipping
  # Label smoothing of the training loss (translation uses 0.1); the logged
  # train/loss is the smoothed one, evaluation losses stay plain cross-entropy.
  config.train.label_smoothing = 0.0
  config.train.log_every = 100           # progress line and train/* scalars
  config.train.checkpoint_every = 500
  config.train.keep_checkpoints = 3
  # A finished workdir whose latest parameters start this run (new optimiser
  # state and schedule): how to train longer, or fine-tune on another task.
  config.train.init_from = ''
  # Early stopping (selfattn/training/early_stopping.py): stop after this many
  # evaluations in a row without a new best of the metric (0: off; num_steps
  # stays the cap and the schedule's length). loss, token_accuracy,
  # sequence_accuracy; bleu and chrf for translation.
  config.train.early_stop_patience = 0
  config.train.early_stop_metric = 'loss'

  config.eval = ml_collections.ConfigDict()
  config.eval.every = 200               # 10 points per eval curve at the default 2000 steps
  config.eval.lengths = [8, 16, 32, 64]  # increasing, no repeats; includes lengths longer than training
  config.eval.num_examples = 256
  # Free-running accuracy of the autoregressive layout (free_running.py):
  # fixed_point (full passes until the fed-back outputs settle; nothing
  # beyond the teacher-forced pass for one output) or cache (one token at a
  # time; cheaper when the rounds are many, scripts/bench_free_running.py).
  config.eval.free_running = 'fixed_point'
  # Attention maps and position tables drawn into TensorBoard at each
  # evaluation (Matplotlib; about 1 s to import and a compiled probe per
  # run). False keeps every scalar and text and skips the images.
  config.eval.figures = True

  config.mesh = ml_collections.ConfigDict()
  config.mesh.data = -1                  # data-parallel devices; -1 = all
  return config


def _add_options(section: ml_collections.ConfigDict, where: str,
                 options: dict) -> None:
  """Registered options as fields of config.<where>, after its own: an
  option named like one of them (from a register_task or
  register_position outside the package) would overwrite it."""
  for name, value in options.items():
    if name in section:
      owner = 'task' if where == 'task' else 'encoding'
      raise ValueError(f'option {name!r} of a registered {owner} is named '
                       f'like the field config.{where}.{name}; rename the '
                       f'option')
    section[name] = value
