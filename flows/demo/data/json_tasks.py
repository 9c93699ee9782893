"""Demo JSON-extraction tasks: pull named fields out of a short text into an object.

The reference is `{"schema": ...}`, a JSON Schema with the requested keys required and
their types, enums and patterns; `gold` is the object the text states. Texts are built
from one sentence per field (several phrasings each), distractor fields and filler
sentences in shuffled order, so two tasks of the same family rarely share long spans.
"""
import json
import random

from flows.demo.data.vocab import CITIES, expand, full_name

_S = {"type": "string", "minLength": 1}
_I = {"type": "integer"}
_N = {"type": "number"}
_B = {"type": "boolean"}


def _pattern(p: str) -> dict:
    return {"type": "string", "pattern": p}


def _enum(*values: str) -> dict:
    return {"type": "string", "enum": list(values)}


def _date(rng):
    return f"2026-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}"


def _digits(rng, n):
    return "".join(rng.choice("0123456789") for _ in range(n))


def _letters(rng, n, alphabet="ABCDEFGHJKLMNPRSTUVWXYZ"):
    return "".join(rng.choice(alphabet) for _ in range(n))


# field -> (schema, value sampler, sentence phrasings with {v})
_F = {
    "name": (_S, full_name, ("[The applicant|The customer|Our new member] is {v}.", "{v} filled in the form.", "Signed, {v}.")),
    "age": ({"type": "integer", "minimum": 0, "maximum": 130}, lambda r: r.randint(18, 90),
            ("[They are|Age:] {v}[ years old|].", "Turned {v} this year.", "Their age is listed as {v}.")),
    "city": (_S, lambda r: r.choice(CITIES), ("[Lives|Based] in {v}.", "Current city: {v}.", "They moved to {v} recently.")),
    "email": (_pattern(r"^[^@\s]+@[^@\s]+\.[a-z]+$"), lambda r: f"{_letters(r, 5).lower()}{r.randint(1, 99)}@example.{r.choice(('com', 'org', 'net'))}",
              ("Contact: {v}.", "You can reach them at {v}.", "Email {v} for details.")),
    "order_id": (_pattern(r"^ORD-[0-9]{5}$"), lambda r: f"ORD-{_digits(r, 5)}", ("Order {v} was placed today.", "Reference number {v}.", "[Re|About] order {v}:")),
    "item": (_S, lambda r: r.choice(("desk lamp", "yoga mat", "coffee grinder", "usb hub", "rain jacket", "kettle", "monitor arm")),
             ("The item is a {v}.", "They ordered a {v}.", "Product: {v}.")),
    "quantity": ({"type": "integer", "minimum": 1}, lambda r: r.randint(1, 40), ("Quantity {v}.", "They want {v} units.", "{v} pieces in total.")),
    "unit_price": (_N, lambda r: r.randint(100, 9999) / 100, ("Each costs {v} dollars.", "Unit price: {v}.", "Priced at {v} per unit.")),
    "express": (_B, lambda r: r.random() < 0.5, ("Express shipping: {v}.", "express={v}")),
    "title": (_S, lambda r: r.choice(("Spring Data Meetup", "Night Market", "Open Studio Day", "Chess Open", "The Salt Road",
                                      "Repair Cafe", "Winter Ledger", "Lanterns at Dusk")),
              ("It is called {v}.", "Title: {v}.", "The title reads {v}.")),
    "date": (_pattern(r"^[0-9]{4}-[0-9]{2}-[0-9]{2}$"), _date, ("It takes place on {v}.", "Date: {v}.", "Scheduled for {v}.")),
    "capacity": (_I, lambda r: r.randint(10, 900), ("Room for {v} people.", "Capacity is {v}.", "Up to {v} guests.")),
    "online": (_B, lambda r: r.random() < 0.5, ("Online: {v}.", "Streamed online: {v}.")),
    "price": ({"type": "number", "minimum": 0}, lambda r: r.randint(99, 99999) / 100, ("It sells for {v}.", "Price {v}.", "Listed at {v}.")),
    "currency": (_enum("USD", "EUR", "GBP", "JPY"), lambda r: r.choice(("USD", "EUR", "GBP", "JPY")), ("Currency: {v}.", "Prices are in {v}.")),
    "in_stock": (_B, lambda r: r.random() < 0.5, ("In stock: {v}.", "Availability flag is {v}.")),
    "sku": (_pattern(r"^[A-Z]{3}-[0-9]{4}$"), lambda r: f"{_letters(r, 3)}-{_digits(r, 4)}", ("SKU {v}.", "Catalogue code {v}.")),
    "flight_number": (_pattern(r"^[A-Z]{2}[0-9]{3,4}$"), lambda r: f"{_letters(r, 2)}{_digits(r, r.choice((3, 4)))}",
                      ("Flight {v} is delayed.", "Booked on {v}.", "Your flight number is {v}.")),
    "origin": (_S, lambda r: r.choice(CITIES), ("Departing from {v}.", "It leaves {v}.")),
    "destination": (_S, lambda r: r.choice(CITIES), ("Arriving in {v}.", "Bound for {v}.", "Destination {v}.")),
    "departure": (_pattern(r"^[0-2][0-9]:[0-5][0-9]$"), lambda r: f"{r.randint(0, 23):02d}:{r.choice(('00', '15', '30', '45', '05'))}",
                  ("Departure at {v}.", "Boarding closes before the {v} departure.")),
    "gate": (_S, lambda r: f"{r.choice('ABCDE')}{r.randint(1, 40)}", ("Gate {v}.", "Go to gate {v}.")),
    "job_title": (_S, lambda r: r.choice(("Data Engineer", "Nurse", "Sous Chef", "Site Reliability Engineer", "Accountant", "Welder")),
                  ("We are hiring a {v}.", "Role: {v}.", "Position open: {v}.")),
    "company": (_S, lambda r: r.choice(("Nordlys AS", "Acme Robotics", "Blue Finch Ltd", "Kiwi Health", "Orbital Foods")),
                ("The employer is {v}.", "Company: {v}.", "{v} is looking for people.")),
    "salary": ({"type": "integer", "minimum": 0}, lambda r: r.randint(25, 180) * 1000, ("Salary {v} per year.", "Pays {v} annually.")),
    "remote": (_B, lambda r: r.random() < 0.5, ("Remote: {v}.", "Remote work allowed: {v}.")),
    "level": (_enum("junior", "mid", "senior"), lambda r: r.choice(("junior", "mid", "senior")), ("Level: {v}.", "This is a {v} position.")),
    "author": (_S, full_name, ("Written by {v}.", "Author: {v}.")),
    "year": ({"type": "integer", "minimum": 1400, "maximum": 2100}, lambda r: r.randint(1950, 2026), ("Published in {v}.", "First edition {v}.")),
    "genre": (_enum("fiction", "history", "science", "poetry", "travel"), lambda r: r.choice(("fiction", "history", "science", "poetry", "travel")),
              ("Genre: {v}.", "Shelved under {v}.")),
    "pages": ({"type": "integer", "minimum": 1}, lambda r: r.randint(80, 900), ("{v} pages long.", "Page count {v}.")),
    "rating": ({"type": "integer", "minimum": 1, "maximum": 5}, lambda r: r.randint(1, 5), ("I'd give it {v} stars.", "Rating: {v}/5.")),
    "recommend": (_B, lambda r: r.random() < 0.5, ("Would recommend: {v}.", "recommend={v}")),
    "tracking_number": (_pattern(r"^1Z[0-9A-Z]{8}$"), lambda r: "1Z" + _letters(r, 8, "0123456789ABCDEFGHJKLMNPRSTUVWXYZ"),
                        ("Tracking number {v}.", "Track it with {v}.")),
    "carrier": (_enum("UPS", "DHL", "FedEx", "USPS"), lambda r: r.choice(("UPS", "DHL", "FedEx", "USPS")), ("Shipped with {v}.", "Carrier: {v}.")),
    "weight_kg": ({"type": "number", "exclusiveMinimum": 0}, lambda r: r.randint(1, 400) / 10, ("It weighs {v} kg.", "Weight: {v} kg.")),
    "department": (_enum("sales", "engineering", "finance", "support", "legal"), lambda r: r.choice(("sales", "engineering", "finance", "support", "legal")),
                   ("Works in {v}.", "Department: {v}.")),
    "employee_id": (_pattern(r"^E[0-9]{4}$"), lambda r: f"E{_digits(r, 4)}", ("Employee number {v}.", "Badge ID {v}.")),
    "start_year": ({"type": "integer", "minimum": 1950}, lambda r: r.randint(1995, 2026), ("Joined in {v}.", "Started in {v}.")),
    "temperature_c": (_N, lambda r: r.randint(-150, 400) / 10, ("It's {v} °C.", "Temperature {v} C.")),
    "condition": (_enum("sunny", "cloudy", "rain", "snow"), lambda r: r.choice(("sunny", "cloudy", "rain", "snow")), ("Conditions: {v}.", "Expect {v}.")),
    "wind_kmh": ({"type": "integer", "minimum": 0}, lambda r: r.randint(0, 90), ("Wind {v} km/h.", "Gusts around {v} km/h.")),
    "invoice_number": (_pattern(r"^INV-[0-9]{6}$"), lambda r: f"INV-{_digits(r, 6)}", ("Invoice {v} is attached.", "Re: invoice {v}.")),
    "amount": ({"type": "number", "minimum": 0}, lambda r: r.randint(1000, 999999) / 100, ("Amount due {v}.", "Total: {v}.")),
    "paid": (_B, lambda r: r.random() < 0.5, ("Paid: {v}.", "Payment received: {v}.")),
}
FAMILIES = (
    ("name", "age", "city", "email"), ("order_id", "item", "quantity", "unit_price", "express"),
    ("title", "date", "city", "capacity", "online"), ("item", "price", "currency", "in_stock", "sku"),
    ("flight_number", "origin", "destination", "departure", "gate"), ("job_title", "company", "salary", "remote", "level"),
    ("title", "author", "year", "genre", "pages"), ("item", "rating", "recommend", "name"),
    ("tracking_number", "carrier", "weight_kg", "destination"), ("name", "date", "departure", "city"),
    ("employee_id", "name", "department", "start_year"), ("city", "temperature_c", "condition", "wind_kmh"),
    ("invoice_number", "name", "amount", "date", "paid"),
)
_FILLER = (
    "Thanks in advance.", "Forwarded from the shared inbox.", "Sorry for the late reply.", "See below.",
    "Copied from a scanned form, so check spelling.", "Sent from my phone.", "Let me know if anything is missing.",
    "This came in over the weekend.", "Please keep this confidential.", "Notes from the front desk:",
)
_ASKS = (
    "Extract the {fields} from [the following text|this message|the note below] and return a JSON object with keys {keys}.",
    "[Parse|Read] this and give me JSON with {keys}:",
    "From the text below, pull out {fields}. Output JSON only, keys: {keys}.",
    "Return a JSON object ({keys}) describing [this record|the text].",
    "I need the {fields} as JSON (keys {keys}) from:",
)


def _text(rng: random.Random, keys: tuple, values: dict) -> str:
    sentences = [expand(rng.choice(_F[k][2]), rng).format(v=_show(values[k])) for k in keys]
    sentences += rng.sample(_FILLER, rng.choice((0, 1, 1, 2)))
    rng.shuffle(sentences)
    return " ".join(sentences)


def _show(value) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


def _schema(rng: random.Random, keys: list) -> dict:
    schema = {"type": "object", "properties": {k: dict(_F[k][0]) for k in keys}, "required": list(keys)}
    if rng.random() < 0.5:
        schema["additionalProperties"] = False
    return schema


def _bad_response(rng: random.Random, gold: dict, schema: dict) -> tuple[str, dict]:
    text = json.dumps(gold)
    keys = list(gold)
    roll = rng.randrange(6)
    if roll == 0:
        return text[: rng.randint(5, max(6, len(text) - 2))], {"kind": "invalid_json", "detail": "Unterminated string or object"}
    if roll == 1:
        return text.replace('"', "'"), {"kind": "invalid_json", "detail": "Expecting property name enclosed in double quotes"}
    if roll == 2:
        return f"Sure! Here it is:\n{text[:-1]},}}", {"kind": "invalid_json", "detail": "Expecting value: trailing comma"}
    if roll == 3 and len(keys) > 1:
        dropped = rng.choice(keys)
        rest = {k: v for k, v in gold.items() if k != dropped}
        return json.dumps(rest), {"kind": "schema_violation", "detail": f"'{dropped}' is a required property"}
    key = rng.choice(keys)
    wrong = dict(gold, **{key: [gold[key]] if isinstance(gold[key], str) else str(gold[key])})
    return f"```json\n{json.dumps(wrong, indent=2)}\n```", {"kind": "schema_violation", "detail": f"{key}: wrong type"}


def sample_json(rng: random.Random) -> dict:
    """One JSON-extraction task with its failed response (see `flows.demo.data.domains.sample_task`)."""
    family = rng.choice(FAMILIES)
    keys = rng.sample(family, rng.randint(3, len(family)))
    values = {k: _F[k][1](rng) for k in family}
    distractors = [k for k in family if k not in keys]
    body = _text(rng, tuple(keys) + tuple(rng.sample(distractors, len(distractors) // 2 + 1) if distractors else ()), values)
    ask = expand(rng.choice(_ASKS), rng).format(
        fields=", ".join(k.replace("_", " ") for k in keys[:-1]) + " and " + keys[-1].replace("_", " "),
        keys=", ".join(f'"{k}"' for k in keys))
    prompt = f"{ask}\n\n{body}" if rng.random() < 0.8 else f"{body}\n\n{ask}"
    gold = {k: values[k] for k in keys}
    schema = _schema(rng, keys)
    response, failure = _bad_response(rng, gold, schema)
    return {"domain": "json", "prompt": prompt, "reference": {"schema": schema}, "gold": json.dumps(gold),
            "key": ("json", tuple(keys), tuple(str(values[k]) for k in keys)), "response": response, "failure": failure}
