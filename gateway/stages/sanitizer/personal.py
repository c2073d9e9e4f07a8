"""Personal data in outgoing text: the records of people, as an agent would copy them out.

`personal_kinds(text)` answers which kinds of personal data a text holds and how many values
of each: `email`, `phone` (international `+` form, or a number under a phone label), `iban`
(mod-97 checked), `national_id` (a US SSN, a UK National Insurance number, or a number under an
id label: NHS, BSN, NIR, DNI, PESEL, Steuer-ID, insurance or passport number, in several
languages), `birthdate` (a full date under a birth label: dob, born, geb., naissance, nacimiento,
…), `health` (an ICD-10 code or a diagnosis/medication label with a value), `pay` (a number under
a salary/wage/compensation label), `address` (a street
address: house number and street word, in several languages, or a value under an address
label) and `name` (a person's
name under a name label: name, patient, holder, nom, prenom, nombre, vorname, …). `keys` are
the field or query-parameter names the text came from; they count as labels, and so do a table's
column headers (CSV, TSV, `;` or markdown: `labelled_table`).

`carries_personal(kinds)` is the judgement the rules use: data about people rather than one
address: an identifying kind (an IBAN, a national id, a birth date, a diagnosis, pay) with any other
kind, an email with a phone number (a contact record), or two values of contact or account data
(a list of people). One email, one phone number, one date or one diagnosis code alone, or a name
with an email (a sign-up form), is not enough: an unsubscribe link, a shop's public number, an ICD
lookup. `identifies_person(kinds)` is the stricter judgement for a URL's query and path.

Pure functions; a text with no `@`, no `+` and fewer than six digits costs a character count.
See docs/detection.md, "Personal data leaving".
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Final

__all__ = ["carries_personal", "emails", "identifies_person", "labelled_table", "personal_kinds"]

MAX_TEXT: Final = 65_536

_EMAIL: Final = re.compile(r"(?<![\w.+-])[A-Za-z0-9][\w.+-]{0,63}@[A-Za-z0-9-]{1,63}(?:\.[A-Za-z0-9-]{1,63})*\.[A-Za-z]{2,24}\b")
_PHONE: Final = re.compile(r"(?<![\w+])\+[1-9][\d \-().]{6,18}\d(?!\d)")
_IBAN: Final = re.compile(r"\b[A-Z]{2}\d{2}(?: ?[A-Z0-9]{4}){2,7}(?: ?[A-Z0-9]{1,4})?\b")
_SSN: Final = re.compile(r"(?<!\d)(?!000|666|9)\d{3}-(?!00)\d{2}-(?!0000)\d{4}(?!\d)")
_NINO: Final = re.compile(r"\b[A-CEGHJ-PR-TW-Z]{2} ?\d{2} ?\d{2} ?\d{2} ?[A-D]\b")
_DATE: Final = r"(?:\d{4}[-/.]\d{1,2}[-/.]\d{1,2}|\d{1,2}[-/.]\d{1,2}[-/.]\d{4}|\d{1,2}\.? [A-Za-zéû]{3,9}\.? \d{4})"
_LABEL_GAP: Final = r"[\"'\s:=\]_,(-]{0,6}(?:[A-Za-z ]{0,12}[:=]\s?)?"
_BIRTH: Final = re.compile(
    r"(?i:\b(?:dob|d\.o\.b|birth\w*|born|geb(?:oren|urtsdatum)?\.?|date[ _]?(?:de[ _])?naissance|n[ée]e?|"
    r"naissance|(?:fecha[ _]de[ _])?nacimiento|data[ _]di[ _]nascita|geboortedatum|f\.? ?nac\.?))"
    + _LABEL_GAP + _DATE
)
_ID_LABEL: Final = re.compile(
    r"(?i:\b(?:ssn|social[ _]security|nhs|nino|ni(?:[ _]number)?|national[ _](?:id|insurance)|bsn|nir|dni|nie|pesel|"
    r"steuer[ _-]?id|versicherten[ _-]?(?:nr|nummer)|insurance[ _](?:no|number|id)|passport|personalausweis|"
    r"codice[ _]fiscale|cpf|curp|sozialversicherungs\w*|numéro[ _]de[ _]sécurité[ _]sociale|mrn|member[ _]id))"
    + _LABEL_GAP + r"([A-Z]{0,2} ?\d[\d ./-]{4,18}[\dA-Z])"
)
_PHONE_LABEL: Final = re.compile(
    r"(?i:\b(?:phone|tel|telefon|teléfono|telefono|téléphone|mobile|mobil|cell|handy|móvil|portable))" + _LABEL_GAP + r"(\(?\d[\d \-().]{6,16}\d)"
)
_ICD: Final = re.compile(r"\b[A-TV-Z]\d{2}\.\d{1,4}\b")
_HEALTH_LABEL: Final = re.compile(
    r"(?i:\b(?:diagnos[ei]s|diagnose|diagnóstico|diagnostic|dx|icd(?:10)?|condition|medication|meds?|rx|prescription|"
    r"befund|medikament\w*|médicament\w*|medicamento|allerg(?:y|ies|ie))\b)" + _LABEL_GAP + r"[A-Za-z0-9]"
)
_NAME_LABEL: Final = re.compile(
    r"(?:\b(?i:name|full[ _]?name|first[ _]?name|last[ _]?name|given[ _]?name|family[ _]?name|fname|lname|fn|ln|surname|patient(?:in)?|holder|account[ _]holder|"
    r"titular|titulaire|nom|pr[ée]nom|nombre|apellidos?|vorname|nachname|cliente?s?|customer|employee|member))"
    + _LABEL_GAP + r"[A-ZÀ-Ý][a-zà-ÿ]+(?:[ +-][A-ZÀ-Ý][a-zà-ÿ]+)?"
)
#: A street address: a house number before a street name ending in a street word, a German street
#: name ending in -straße/-weg/… before its number, a French/Spanish/Italian street word after
#: its number, or any value with a digit under an address label.
_ADDRESS: Final = re.compile(
    r"\b\d{1,5}[A-Za-z]?,? (?:[A-Z][\w'.-]*\.? ){1,4}(?i:street|st|road|rd|avenue|ave|lane|ln|boulevard|blvd|drive|dr|way|"
    r"court|ct|place|pl|terrace|close|square|crescent|parkway|highway|hwy)\b"
    r"|\b[A-ZÄÖÜ][a-zäöüß]+(?:straße|strasse|str\.|weg|gasse|allee|platz|ring|damm) \d{1,4}[a-z]?\b"
    r"|\b\d{1,4},? (?:rue|avenue|boulevard|chemin|impasse|calle|avenida|via|viale|piazza|corso) (?:(?:de|du|des|la|le|del|di|d')[ ']?){0,2}[A-ZÀ-Ý]"
    r"|(?i:\b(?:address|addr|street|adresse|anschrift|direcci[oó]n|indirizzo|morada))" + _LABEL_GAP + r"[^\n]{0,40}\d"
)
#: Pay under a pay label (round 7, ec-personal-data-to-outside): what HR and payroll exports hold.
_PAY_LABEL: Final = re.compile(
    r"(?i:\b(?:salary|salaries|wage|gross[ _]pay|net[ _]pay|base[ _]pay|compensation|bonus|gehalt|lohn|salaire|salario|stipendio))"
    + _LABEL_GAP + r"[$€£]?\s?\d[\d,.' ]{2,}"
)
_LISTED: Final = frozenset({"email", "phone", "iban", "national_id"})  # two of them: a list of people
_IDENTIFYING: Final = frozenset({"iban", "national_id", "birthdate", "health", "pay"})
_TABLE_ROWS: Final = 200  # rows of a table read as labelled fields
_CELL_SPLIT: Final = {",": re.compile(r","), "\t": re.compile(r"\t"), ";": re.compile(r";"), "|": re.compile(r"\s*\|\s*")}
_RULE_ROW: Final = re.compile(r"^[\s|:+-]+$")
_CELL_EDGE: Final = ' \t\r"'
_FIELD_PREFIX: Final = re.compile(r"^[\w .-]{1,40}:\s+(?=\S)")


def personal_kinds(text: str) -> dict[str, int]:
    """{kind: distinct values} of the personal data in `text` (see the module docstring)."""
    text = text[:MAX_TEXT]
    if "\n" in text:
        text += labelled_table(text)
    digits = sum(map(str.isdigit, text)) if len(text) < 4096 else 6
    if "@" not in text and digits < 6 and not _NAME_LABEL.search(text):
        return {}
    found: dict[str, set[str]] = {}
    if "@" in text:
        _put(found, "email", (m.group().lower() for m in _EMAIL.finditer(text)))
    if digits >= 3:
        _numbers(text, found)
    if digits:
        _put(found, "address", (m.group().lower() for m in _ADDRESS.finditer(text)))
    names = {re.sub(r"\W+", " ", m.group()).split(" ", 1)[-1] for m in _NAME_LABEL.finditer(text)}
    _put(found, "name", names)
    return {kind: len(values) for kind, values in found.items() if values}


def _numbers(text: str, found: dict[str, set[str]]) -> None:
    """The kinds that are numbers: phones, IBANs, national ids, birth dates, diagnosis codes."""
    _put(found, "phone", (re.sub(r"\D", "", m.group()) for m in _PHONE.finditer(text) if 8 <= len(re.sub(r"\D", "", m.group())) <= 15))
    _put(found, "phone", (re.sub(r"\D", "", m.group(1)) for m in _PHONE_LABEL.finditer(text)))
    _put(found, "iban", (m.group().replace(" ", "") for m in _IBAN.finditer(text) if _iban_ok(m.group())))
    _put(found, "national_id", (m.group() for m in _SSN.finditer(text)))
    _put(found, "national_id", (m.group().replace(" ", "") for m in _NINO.finditer(text)))
    _put(found, "national_id", (re.sub(r"\W", "", m.group(1)) for m in _ID_LABEL.finditer(text)))
    _put(found, "birthdate", (m.group() for m in _BIRTH.finditer(text)))
    _put(found, "pay", (m.group() for m in _PAY_LABEL.finditer(text)))
    health = [m.group() for m in _HEALTH_LABEL.finditer(text)]
    if health or _ICD.search(text):
        _put(found, "health", health or [m.group() for m in _ICD.finditer(text)])


def labelled_table(text: str) -> str:
    """A CSV, TSV, semicolon or markdown table's rows as `header: cell` lines ("" for text without
    one), so a column's header labels its cells as a field's name labels its value (`name,salary`
    over `Jane Smith,72000` reads `name: Jane Smith`, `salary: 72000`). The header is the first line
    the next line (a markdown rule aside) matches cell for cell."""
    lines = [line.strip().strip("|") for line in text.split("\n", _TABLE_ROWS + 2)[: _TABLE_ROWS + 1]]
    for i, head in enumerate(lines[:-1]):
        head = _FIELD_PREFIX.sub("", head, count=1).strip().strip("|")  # `report: | Name | Phone |`: a field's table
        sep = next((c for c in ("\t", "|", ";", ",") if c in head), None)
        if sep is None:
            continue
        split = _CELL_SPLIT[sep]
        header = [h.strip(_CELL_EDGE + "*'") for h in split.split(head)]
        rows = [split.split(row) for row in lines[i + 1 :] if row and not _RULE_ROW.match(row)]
        if rows and len(rows[0]) == len(header) and _header(header):
            return "\n" + "\n".join(f"{h}: {c.strip(_CELL_EDGE)}" for row in rows if len(row) == len(header)
                                     for h, c in zip(header, row))
    return ""


def _header(cells: list[str]) -> bool:
    """Whether a table row can be a header: 2..32 short cells, none empty or starting with a digit."""
    return 2 <= len(cells) <= 32 and all(cell and len(cell) <= 40 and not cell[0].isdigit() for cell in cells)


def _put(found: dict[str, set[str]], kind: str, values: Iterable[str]) -> None:
    bucket = found.setdefault(kind, set())
    for value in values:
        if len(bucket) >= 64:
            return
        bucket.add(value)


def _iban_ok(text: str) -> bool:
    """ISO 13616 mod-97 check of an IBAN (spaces allowed)."""
    iban = text.replace(" ", "")
    if not 15 <= len(iban) <= 34:
        return False
    moved = iban[4:] + iban[:4]
    return int("".join(str(int(c, 36)) for c in moved)) % 97 == 1


def emails(text: str) -> set[str]:
    """The distinct email addresses in `text`, lower-cased."""
    return {m.group().lower() for m in _EMAIL.finditer(text[:MAX_TEXT])} if "@" in text else set()


def identifies_person(kinds: dict[str, int]) -> bool:
    """Whether `kinds`, found in a URL's query or path, identify a person: data about people
    (`carries_personal`), a national id or a birth date alone, a name with contact, address or
    identity data, or an address with contact data. Stricter than a message: a URL is sent to a
    third party and logged by every proxy on the way; one email (an unsubscribe link), one phone
    number (a business lookup) or one address (a geocoder) alone still passes."""
    present = kinds.keys()
    if carries_personal(kinds) or present & {"national_id", "birthdate"}:
        return True
    if "name" in present and present & {"email", "phone", "address", "health", "iban"}:
        return True
    return "address" in present and bool(present & {"email", "phone"})


def carries_personal(kinds: dict[str, int]) -> bool:
    """Whether `kinds` is data about people (see the module docstring)."""
    present = kinds.keys()
    if present & _IDENTIFYING and len(present) >= 2:
        return True
    return {"email", "phone"} <= present or any(kinds[k] >= 2 for k in present & _LISTED)
