"""tblock.dropout is tblock.lesson.dropout, under the name it has always had."""

import sys

from .lesson import dropout

sys.modules[__name__] = dropout
