"""Real music: JSB Chorales (`jsb`: loading and serializing), the language
model task (`task`), scoring and sampling whole chorales (`lm_eval`), and
listening to them (`listening`: MIDI, piano rolls, audio)."""

from selfattn.tasks.music.task import JSB_TASKS
