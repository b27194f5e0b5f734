"""Assembles a varied text corpus (>= 2 MB) from files that ship with Debian and the reference
venv: fortunes (prose), licences, manual pages (English and translated), gettext catalogues in
~40 languages, Python and C source, JSON; plus emoji, whitespace runs, NFD text and the
tokenizer's own special-token text spliced into ordinary text. Deterministic for a given set of
installed files. Used by tokenizer_reference.py and bench/tokenizer.py."""
import glob
import gettext
import gzip
import json
import os
import random
import sys
import sysconfig
import unicodedata


def _read(path, limit):
    try:
        with open(path, "rb") as f:
            data = f.read(limit)
        return data.decode("utf-8")
    except (OSError, UnicodeDecodeError):
        return None


def _chunks(text, rng, lo=300, hi=6000):
    out, i = [], 0
    while i < len(text):
        n = rng.randint(lo, hi)
        out.append(text[i:i + n])
        i += n
    return out


def _budget(paths, per_file, total, rng, reader=None):
    """Texts from sorted paths until `total` characters, at most `per_file` from each."""
    reader = reader or (lambda p: _read(p, per_file * 4))
    texts, size = [], 0
    for p in paths:
        if size >= total:
            break
        t = reader(p)
        if not t:
            continue
        t = t[:per_file]
        texts.extend(_chunks(t, rng))
        size += len(t)
    return texts


def _man(path):
    try:
        with gzip.open(path, "rb") as f:
            return f.read(200000).decode("utf-8")
    except (OSError, UnicodeDecodeError, EOFError):
        return None


def _mo(path):
    try:
        with open(path, "rb") as f:
            cat = gettext.GNUTranslations(f)._catalog
    except Exception:  # corrupt or unusual catalogues are simply skipped
        return None
    vals = [v for k, v in sorted(cat.items(), key=lambda kv: str(kv[0])) if k and isinstance(v, str)]
    return "\n".join(vals)


def _emoji(rng, n):
    singles = [chr(c) for c in list(range(0x1F300, 0x1F5FF)) + list(range(0x1F600, 0x1F64F)) +
               list(range(0x1F900, 0x1F9FF)) if unicodedata.name(chr(c), "")]
    zwj = ["\U0001F468\u200D\U0001F469\u200D\U0001F467", "\U0001F3F3\uFE0F\u200D\U0001F308",
           "\U0001F44D\U0001F3FD", "\U0001F1E9\U0001F1EA", "\U0001F1EF\U0001F1F5", "\u2764\uFE0F"]
    words = ["hello", "ok", "so", "the", "naïve", "東京", "да", "2024", "!!", "..."]
    out = []
    for _ in range(n):
        parts = [rng.choice(singles + zwj + words) for _ in range(rng.randint(5, 60))]
        out.append("".join(p + rng.choice(["", " ", " ", "\n"]) for p in parts))
    return out


def _whitespace(rng, n):
    ws = [" ", "  ", "\t", "\n", "\r\n", "\n\n", "\u00a0", "\u3000", "\u2009", "\u200b", "\u180e", "\u2028", "\x0b", "\x0c", "\x85"]
    out = []
    for _ in range(n):
        parts = []
        for _ in range(rng.randint(3, 40)):
            parts.append(rng.choice(["x", "word", "42", "(a)", "ünï", "é", "'s", "'LL", "I'm", ""]))
            parts.append("".join(rng.choice(ws) for _ in range(rng.randint(1, 8))) * rng.choice([1, 1, 1, 3, 50]))
        out.append("".join(parts))
    out.append(" " * 5000)
    out.append("\n" * 3000 + "end")
    out.append("a" + "\t " * 2000)
    out.append("")
    return out


def assemble(special_texts=(), seed=1234, min_bytes=2_100_000):
    rng = random.Random(seed)
    docs = []
    fortunes = sorted(p for p in glob.glob("/usr/share/games/fortunes/*")
                      if not p.endswith((".dat", ".u8")) and os.path.isfile(p))
    docs += _budget(fortunes, 40000, 400000, rng)
    docs += _budget(sorted(glob.glob("/usr/share/common-licenses/*")), 30000, 100000, rng)
    docs += _budget(sorted(glob.glob("/usr/share/man/man[1-8]/*.gz"))[::17], 15000, 120000, rng, _man)
    docs += _budget(sorted(glob.glob("/usr/share/man/[a-z][a-z]*/man1/*.gz"))[::5], 6000, 120000, rng, _man)
    mos = {}
    for p in sorted(glob.glob("/usr/share/locale/*/LC_MESSAGES/*.mo")):
        mos.setdefault(p.split("/")[4], []).append(p)
    for lang in sorted(mos):
        docs += _budget(mos[lang], 3000, 4000, rng, _mo)
    stdlib = sysconfig.get_paths()["stdlib"]
    docs += _budget(sorted(glob.glob(os.path.join(stdlib, "*.py")))[::7], 20000, 150000, rng)
    docs += _budget(sorted(glob.glob("/usr/include/*.h")), 12000, 120000, rng)
    jsons = sorted(glob.glob(os.path.join(sys.prefix, "lib", "python3*", "site-packages", "*", "*.json")))
    jsons += sorted(glob.glob("/usr/share/**/*.json", recursive=True))[:200]
    docs += _budget(jsons, 15000, 80000, rng)
    docs += _emoji(rng, 150)
    docs += _whitespace(rng, 150)
    # Decomposed (NFD) accents, which NFC normalizers recompose.
    docs += [unicodedata.normalize("NFD", d) for d in docs[::97] if not d.isascii()][:100]
    # The tokenizer's special-token texts inside ordinary text, glued and spaced.
    specials = list(special_texts)
    if specials:
        for d in docs[::41][:200]:
            cut = [rng.randint(0, len(d)) for _ in range(rng.randint(1, 4))]
            s = d
            for c in sorted(cut, reverse=True):
                s = s[:c] + rng.choice(["", " ", "\n"]) + rng.choice(specials) + rng.choice(["", " "]) + s[c:]
            docs.append(s)
        docs.append("".join(specials))
        docs.append(" ".join(specials))
    size = sum(len(d.encode("utf-8")) for d in docs)
    if size < min_bytes:
        raise SystemExit(f"corpus: only {size} bytes of text found on this machine (need {min_bytes})")
    return docs


if __name__ == "__main__":
    docs = assemble()
    print(len(docs), sum(len(d.encode()) for d in docs))
