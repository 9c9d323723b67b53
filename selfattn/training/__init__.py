"""selfattn.training: the training system behind `python -m selfattn.main`.

A config is checked (`config_checks`), its task and model built (`build`),
trained by one jitted step (`steps`; translation's in `translation_steps`,
chosen by `trainers`) inside the loop (`train.train_and_evaluate`) with
checkpoints, a workdir, TensorBoard summaries and figures, a report, timing
and a record of the software stack. `trained.load_model` gives a finished
run's model back from its workdir.
"""

from selfattn.training.build import build_model
from selfattn.training.build import task_from_config
from selfattn.training.config_checks import validate_config
from selfattn.training.train import train_and_evaluate
from selfattn.training.trained import load_model
from selfattn.training.trained import stored_config
