"""tblock.analysis is tblock.lesson.analysis, under the name it has always had."""

import sys

from .lesson import analysis

sys.modules[__name__] = analysis
