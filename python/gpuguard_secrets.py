"""The secrets of gpuguard's alert configuration and their masking.

NOTIFY_URL and ALERTMANAGER_URL are lists of URLs (split_urls), each with
an optional "PROVIDER:LANG+" prefix (strip_prefix); NOTIFY_SECRET holds the
signing secrets. Their tokens (query values such as access_token or key,
long path segments, passwords) and the secrets themselves are what
scrub() masks, in log lines as in alert texts (a job's command line may
carry its own webhook URL).

Both python/gpuguard_alert.py (logs, delivery state) and
python/gpuguard_render.py (command lines in messages) use it; it imports
neither. Standard library only.
"""
import re
import urllib.parse

_SECRET_QUERY_KEYS = ("access_token", "key", "token", "sign", "secret")


def split_urls(value):
    # ASCII separators only, as lib/config.sh splits: a full-width space
    # stays in its URL and makes that one target malformed
    return [u for u in re.split(r"[ \t\n\r\f\v,;]+", value or "") if u]



def strip_prefix(raw):
    """("provider:lang" prefix or "", URL) of one NOTIFY_URL entry."""
    head = raw.split("://", 1)[0]
    if "+" in head:
        prefix, url = raw.split("+", 1)
        return prefix, url
    return "", raw



def _secrets(env):
    """Every secret string known from the environment env, longest first."""
    found = set()
    for s in re.split(r"[\s,;]+", env.get("NOTIFY_SECRET", "")):
        if len(s) >= 4:
            found.add(s)
    for url in split_urls(env.get("NOTIFY_URL", "")) + \
            split_urls(env.get("ALERTMANAGER_URL", "")):
        try:
            parts = urllib.parse.urlsplit(strip_prefix(url)[1])
        except ValueError:
            # a malformed target: mask every long piece of its user, path
            # and query (all of it when it has no scheme://host to show)
            m = re.match(r"[^:/?#]*://([^/?#]*)(.*)", url, re.DOTALL)
            rest = (m.group(1).rpartition("@")[0] + "/" + m.group(2)) if m else url
            found.update(p for p in re.split(r"[/?&=#@:;\[\]]+", rest) if len(p) >= 4)
            if not m and len(url) >= 4:
                found.add(url)
            continue
        for key, value in urllib.parse.parse_qsl(parts.query):
            if key.lower() in _SECRET_QUERY_KEYS and len(value) >= 4:
                found.add(value)
        for seg in parts.path.split("/"):
            if len(seg) >= 16:
                found.add(seg)
        if parts.password:
            found.add(parts.password)
    return sorted(found, key=len, reverse=True)


def scrub(text, env):
    """Masks every secret of env, and any token-looking query value."""
    text = str(text)
    for s in _secrets(env):
        text = text.replace(s, "***")
        text = text.replace(urllib.parse.quote(s, safe=""), "***")
    # (a closing parenthesis ends the value: a message that puts a URL in
    # parentheses keeps its ")"; the configured secrets went above, whole)
    return re.sub(r"((?:{})=)[^&\s\"')]+".format("|".join(_SECRET_QUERY_KEYS)),
                  r"\1***", text)
