"""tblock.encdec is tblock.lesson.encdec, under the name it has always had."""

import sys

from .lesson import encdec

sys.modules[__name__] = encdec
