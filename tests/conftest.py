import os
import sys

# Tests import their helpers (reference.py) by name.
sys.path.insert(0, os.path.dirname(__file__))
