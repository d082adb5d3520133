"""A horizontal bar chart written as PNG with numpy and zlib (no plotting library).

matplotlib is not part of either lane's environment, so the chart is drawn
pixel by pixel with a 3x5 bitmap font (upper case, digits, a few signs).
"""
import struct
import zlib

import numpy as np

_GLYPHS = {  # 5 rows of 3 cells
    'A': '.#. #.# ### #.# #.#', 'B': '##. #.# ##. #.# ##.', 'C': '.## #.. #.. #.. .##',
    'D': '##. #.# #.# #.# ##.', 'E': '### #.. ##. #.. ###', 'F': '### #.. ##. #.. #..',
    'G': '.## #.. #.# #.# .##', 'H': '#.# #.# ### #.# #.#', 'I': '### .#. .#. .#. ###',
    'J': '..# ..# ..# #.# .#.', 'K': '#.# #.# ##. #.# #.#', 'L': '#.. #.. #.. #.. ###',
    'M': '#.# ### ### #.# #.#', 'N': '##. #.# #.# #.# #.#', 'O': '.#. #.# #.# #.# .#.',
    'P': '##. #.# ##. #.. #..', 'Q': '.#. #.# #.# ##. .##', 'R': '##. #.# ##. #.# #.#',
    'S': '.## #.. .#. ..# ##.', 'T': '### .#. .#. .#. .#.', 'U': '#.# #.# #.# #.# .##',
    'V': '#.# #.# #.# .#. .#.', 'W': '#.# #.# ### ### #.#', 'X': '#.# #.# .#. #.# #.#',
    'Y': '#.# #.# .#. .#. .#.', 'Z': '### ..# .#. #.. ###', '0': '### #.# #.# #.# ###',
    '1': '.#. ##. .#. .#. ###', '2': '##. ..# .#. #.. ###', '3': '##. ..# .#. ..# ##.',
    '4': '#.# #.# ### ..# ..#', '5': '### #.. ##. ..# ##.', '6': '.## #.. ### #.# ###',
    '7': '### ..# .#. .#. .#.', '8': '### #.# ### #.# ###', '9': '### #.# ### ..# ##.',
    '.': '... ... ... ... .#.', '_': '... ... ... ... ###', '-': '... ... ### ... ...',
    '/': '..# ..# .#. #.. #..', ':': '... .#. ... .#. ...', '(': '.#. #.. #.. #.. .#.',
    ')': '.#. ..# ..# ..# .#.', '%': '#.# ..# .#. #.. #.#', '=': '... ### ... ### ...',
    '>': '#.. .#. ..# .#. #..', '<': '..# .#. #.. .#. ..#', ',': '... ... ... .#. #..',
    '+': '... .#. ### .#. ...', ' ': '... ... ... ... ...',
}
_SCALE = 2
_GLYPH_W, _GLYPH_H = 3 * _SCALE, 5 * _SCALE
_ADVANCE = _GLYPH_W + _SCALE
_LINE = _GLYPH_H + 6 * _SCALE
_PALETTE = [(31, 119, 180), (255, 127, 14), (44, 160, 44), (214, 39, 40),
            (148, 103, 189), (140, 86, 75), (227, 119, 194), (127, 127, 127),
            (188, 189, 34), (23, 190, 207)]


def _glyph(char):
  pattern = _GLYPHS.get(char, _GLYPHS.get(char.upper(), _GLYPHS[' ']))
  cells = np.array([[c == '#' for c in row] for row in pattern.split()])
  return np.kron(cells, np.ones((_SCALE, _SCALE), bool))


def _text(image, x, y, text, color=(0, 0, 0)):
  for char in text:
    if x + _GLYPH_W > image.shape[1]:
      return
    image[y:y + _GLYPH_H, x:x + _GLYPH_W][_glyph(char)] = color
    x += _ADVANCE


def bar_chart(groups, path, label_width=30, bar_width=360):
  """Writes `groups`: [(title, [(label, value, value_text)])] as one PNG at `path`.

  Bars are scaled to the largest value of their group.
  """
  rows = sum(1 + len(bars) for _, bars in groups) + len(groups)
  width = label_width * _ADVANCE + bar_width + 27 * _ADVANCE
  height = rows * _LINE + _LINE
  image = np.full((height, width, 3), 255, np.uint8)
  y = _LINE // 2
  for title, bars in groups:
    _text(image, 4, y, title)
    y += _LINE
    largest = max([value for _, value, _ in bars if value] or [1])
    for index, (label, value, value_text) in enumerate(bars):
      _text(image, 4, y, label[:label_width])
      x0 = label_width * _ADVANCE
      length = int(bar_width * (value or 0) / largest)
      image[y - 2:y + _GLYPH_H + 2, x0:x0 + length] = _PALETTE[
          index % len(_PALETTE)]
      _text(image, x0 + length + 6, y, value_text)
      y += _LINE
    y += _LINE
  _write_png(image, path)


def _write_png(image, path):
  height, width, _ = image.shape
  raw = b''.join(b'\x00' + image[row].tobytes() for row in range(height))

  def chunk(kind, data):
    return (struct.pack('>I', len(data)) + kind + data +
            struct.pack('>I', zlib.crc32(kind + data) & 0xffffffff))

  with open(path, 'wb') as out:
    out.write(b'\x89PNG\r\n\x1a\n')
    out.write(chunk(b'IHDR', struct.pack('>IIBBBBB', width, height, 8, 2, 0, 0, 0)))
    out.write(chunk(b'IDAT', zlib.compress(raw, 9)))
    out.write(chunk(b'IEND', b''))
