"""Does knowing the meter still help, and help shaw more than sinusoidal,
when the models train until a held-out loss stops improving? (EXPERIMENTS.md
section 6, "The meter", measured it at 1,000 steps, every run still
improving.)

  python -m experiments.music_meter_convergence \
      --workdir=experiments/results/music_meter_convergence
  python -m experiments.music_meter_convergence --workdir=... --scale=quick

experiments/music_convergence.py's protocol (the cosine schedule built for
its cap of 16,000 steps, the loop's loss on 256 validation crops every 500
steps, stopped after 3 evaluations without a new lowest, the lowest
scored on whole pieces) on the music study's "+bar+meter" rows: bar-aligned
crops and a learned embedding of the sixteenth within the bar
(experiments/music.METER), shaw against sinusoidal at seeds 0-2,
seed-major. The report pairs them at 1,000 steps (the music study's runs
of the same seeds, --short_dir) and at the early stop, and pairs each
with the same position's early-stopped first-pass run of the same seed
(experiments/results/music_convergence: no meter, crops on any step), so
that what the meter and bar crops are worth at convergence, and whether
shaw gains more from them than sinusoidal, are read seed by seed. (Shaw
against sinusoidal only: whether the relative encodings as a group gain
more is not asked here.) A run that reaches the cap is not shown
converged; the report's Budget section names them. --scale=quick pairs
its runs with the committed studies' all the same: a smoke test.

Sized from the first-pass convergence runs (same cap and patience): shaw
stopped at 4,000-5,500 steps, sinusoidal at 11,500-16,000; the first
meter run trained at 2.8 steps/s on this 2-core CPU (about 6 minutes per
1,000 steps with evaluations), so the six runs were sized at 5-7.5
hours; they took 2h09m (2026-12-02: shaw 15-25 minutes a run, stopping at
3,000-4,000 steps, sinusoidal 19-28 minutes, at 6,000; the meter speeds
both). Resumable like every study.
"""

from __future__ import annotations

from absl import app

from experiments import music_convergence
from experiments import skeleton
from selfattn.training.cli_checks import parse_flags

# The early-stopped first-pass runs each row is paired with.
FIRST_PASS_DIR = 'experiments/results/music_convergence'

METER = music_convergence.Design(
    'Music to convergence with the meter: shaw against sinusoidal',
    core=('shaw +bar+meter', 'sinusoidal +bar+meter'),
    without_dir=FIRST_PASS_DIR,
    rows='The music study\'s "+bar+meter" rows (bar-aligned crops and a '
         'learned embedding of the sixteenth within the bar; '
         'experiments/music.METER)')

STUDY = music_convergence.MusicConvergence(METER)

if __name__ == '__main__':
  app.run(skeleton.main(STUDY), flags_parser=parse_flags)
