"""The CJK fonts the OCR data engine renders with: where they are, which Debian package ships each,
what licence it carries, and the fixed train / held-out split (whole fonts held out).

Only fonts in ``CATALOGUE`` are used, so a build names exactly what it rendered with and two machines
with the same packages render the same images. A font is found at its Debian path first, then through
fontconfig (``fc-list``), so another distribution's layout works too. One face per design: a TTC's
Mono / HK / TW faces share the design's Chinese glyphs, and a near-copy in both splits would make the
held-out fonts a test of nothing.
"""

from __future__ import annotations

import dataclasses
import shutil
import subprocess
from functools import cache
from pathlib import Path

from sampan.utils.digest import file_sha256

# Debian's font directory; fontconfig is asked only for a font that is not where Debian puts it.
FONT_ROOT = Path("/usr/share/fonts")


@dataclasses.dataclass(frozen=True)
class FontSpec:
    """A font the engine knows.

    Fields:
        id: the short name used in configs, labels and the manifest (``wqy-microhei``).
        family: the face's family name as fontconfig and the font's name table give it.
        file: the font file's path under ``FONT_ROOT`` in Debian's layout.
        package: the Debian package that ships it (what the "not found" error tells a person to install).
        style: hei (sans), song (serif / Ming) or kai (brush).
        licence: the font's licence, from the package's copyright file.
        held_out: rendered only into the test split, never into train (fixed, not seeded).
    """

    id: str
    family: str
    file: str
    package: str
    style: str
    licence: str
    held_out: bool = False


# The held-out fonts are whole designs whose style a train font also covers (an unseen hei, an unseen
# song), so the test split measures reading a new typeface rather than a new kind of script.
CATALOGUE: tuple[FontSpec, ...] = (
    FontSpec("wqy-microhei", "WenQuanYi Micro Hei", "truetype/wqy/wqy-microhei.ttc", "fonts-wqy-microhei", "hei",
             "Apache-2.0 or GPL-3+ with font exception"),
    FontSpec("ar-pl-uming", "AR PL UMing CN", "truetype/arphic/uming.ttc", "fonts-arphic-uming", "song",
             "Arphic Public License"),
    FontSpec("ar-pl-ukai", "AR PL UKai CN", "truetype/arphic/ukai.ttc", "fonts-arphic-ukai", "kai",
             "Arphic Public License"),
    FontSpec("wqy-zenhei", "WenQuanYi Zen Hei", "truetype/wqy/wqy-zenhei.ttc", "fonts-wqy-zenhei", "hei",
             "GPL-2 with font embedding exception", held_out=True),
    # fonts-noto-cjk (57 MB download) is optional: used when installed, not installed by `make system-deps`.
    FontSpec("noto-sans-cjk-sc", "Noto Sans CJK SC", "opentype/noto/NotoSansCJK-Regular.ttc", "fonts-noto-cjk",
             "hei", "SIL Open Font License 1.1"),
    FontSpec("noto-serif-cjk-sc", "Noto Serif CJK SC", "opentype/noto/NotoSerifCJK-Regular.ttc", "fonts-noto-cjk",
             "song", "SIL Open Font License 1.1", held_out=True),
)
# What `make system-deps` installs (the Makefile's CJK_FONTS): enough for both splits.
DEFAULT_PACKAGES = ("fonts-wqy-microhei", "fonts-wqy-zenhei", "fonts-arphic-uming", "fonts-arphic-ukai")


@dataclasses.dataclass(frozen=True)
class Font:
    """An installed font: its catalogue entry and where its face is.

    Fields:
        spec: the catalogue entry.
        path: the font file.
        index: the face's index inside the file (a .ttc holds several).
    """

    spec: FontSpec
    path: str
    index: int

    @property
    def id(self) -> str:
        return self.spec.id

    def sha256(self) -> str:
        """The font file's SHA-256 (the manifest records it: same id, other bytes, other images)."""
        return _file_sha256(self.path)

    def charset(self) -> frozenset[str]:
        """The characters the face has a glyph for (its cmap); a line is rendered only in a font
        that has every one of its characters, never with a missing-glyph box."""
        return _cmap(self.path, self.index)

    def describe(self) -> dict:
        """The manifest's record of this font."""
        return {"id": self.id, "family": self.spec.family, "path": self.path, "index": self.index,
                "package": self.spec.package, "style": self.spec.style, "licence": self.spec.licence,
                "split": "test" if self.spec.held_out else "train", "sha256": self.sha256()}


@cache
def _file_sha256(path: str) -> str:
    return file_sha256(path)


@cache
def _cmap(path: str, index: int) -> frozenset[str]:
    from fontTools.ttLib import TTFont  # matplotlib's dependency; only the cmap table is read

    with TTFont(path, fontNumber=index, lazy=True) as font:
        return frozenset(chr(c) for c in font.getBestCmap())


def _face_index(path: str, family: str) -> int | None:
    """The index of ``family``'s face in ``path`` (a .ttc holds several), or None."""
    from PIL import ImageFont

    for index in range(16):
        try:
            face = ImageFont.truetype(path, 12, index=index)
        except OSError:  # past the last face
            return None
        if face.getname()[0] == family:
            return index
    return None


def _fontconfig_path(family: str) -> tuple[str, int] | None:
    """Where fontconfig says ``family`` is, or None (no fontconfig, or not installed)."""
    if shutil.which("fc-list") is None:
        return None
    result = subprocess.run(["fc-list", f":family={family}", "file", "index"], capture_output=True, text=True,
                            timeout=30, check=False)
    for line in sorted(result.stdout.splitlines()):
        path, _, rest = line.partition(":")
        if "index=" in rest:
            return path.strip(), int(rest.split("index=")[1].split(":")[0])
    return None


@cache
def installed_fonts() -> tuple[Font, ...]:
    """Every catalogue font found on this machine, in catalogue order."""
    found = []
    for spec in CATALOGUE:
        path = FONT_ROOT / spec.file
        index = _face_index(str(path), spec.family) if path.is_file() else None
        if index is not None:
            found.append(Font(spec, str(path), index))
            continue
        located = _fontconfig_path(spec.family)
        if located is not None and _face_index(located[0], spec.family) == located[1]:
            found.append(Font(spec, *located))
    return tuple(found)


def install_hint(packages: tuple[str, ...] = DEFAULT_PACKAGES) -> str:
    """The command that installs the fonts, for error messages."""
    return (f"install CJK fonts: `sudo apt-get install --no-install-recommends {' '.join(packages)}` "
            "(or `make system-deps`)")


def select_fonts(ids: tuple[str, ...] = (), held_out: tuple[str, ...] | None = None) -> dict[str, list[Font]]:
    """The installed fonts of each split: ``{"train": [...], "test": [...]}``.

    ``ids`` restricts the choice to those catalogue fonts (empty: every installed one); ``held_out``
    replaces the catalogue's fixed held-out fonts. Each split needs at least one font: the error says
    which packages to install.
    """
    known = {spec.id: spec for spec in CATALOGUE}
    if held_out is not None and not held_out:
        raise ValueError("--held-out-fonts is empty: the test split needs a font of its own (leave it unset "
                         "for the catalogue's choice)")
    for name in (*ids, *(held_out or ())):
        if name not in known:
            raise ValueError(f"unknown font {name!r}; known fonts: {', '.join(known)}")
    fonts = list(installed_fonts())
    if not fonts:
        raise FileNotFoundError(f"no CJK font found under {FONT_ROOT} or through fontconfig; {install_hint()}")
    if ids:
        missing = [i for i in ids if i not in {f.id for f in fonts}]
        if missing:
            raise FileNotFoundError(f"fonts {missing} are not installed; "
                               f"{install_hint(tuple(dict.fromkeys(known[i].package for i in missing)))}")
        fonts = [f for f in fonts if f.id in ids]
    test_ids = set(held_out) if held_out is not None else {s.id for s in CATALOGUE if s.held_out}
    splits = {"train": [f for f in fonts if f.id not in test_ids], "test": [f for f in fonts if f.id in test_ids]}
    for split, chosen in splits.items():
        if not chosen:
            wanted = [s for s in CATALOGUE if (s.id in test_ids) == (split == "test")]
            installed = {f.id for f in installed_fonts()}
            missing = tuple(dict.fromkeys(s.package for s in wanted if s.id not in installed))
            raise FileNotFoundError(
                f"no {split} font among the fonts in use ({[f.id for f in fonts]}; the {split} fonts are "
                f"{[s.id for s in wanted]}); " + (f"{install_hint(missing)}, or " if missing else "")
                + "choose with --fonts / --held-out-fonts")
    return splits
