"""Words the demo task generators are built from, and the phrase-alternative expander.

Demo prompts must look like many different users wrote them: a template repeated with
one number changed would make thousands of accidental near duplicates and defeat the
curation figures measured on demo data. So every template carries `[a|b|c]` phrase
alternatives, and the slots draw from the word lists below. Nothing here is random on
its own: every choice takes the caller's `random.Random`.
"""
import random
import re

_ALTERNATIVES = re.compile(r"\[([^\[\]]*\|[^\[\]]*)\]")

NAMES_SHE = (
    "Maria", "Aisha", "Priya", "Chloe", "Sofia", "Mei", "Fatima", "Olga", "Hannah", "Lucia",
    "Amara", "Ingrid", "Yuki", "Zara", "Nadia", "Elena", "Grace", "Leila", "Rosa", "Keiko",
    "Tamar", "Bianca", "Ana", "Mira", "Joanna", "Noor", "Isabel", "Freya", "Dalia", "Wen",
)
NAMES_HE = (
    "Omar", "Liam", "Kenji", "Carlos", "Ivan", "Tariq", "Ben", "Mateo", "Arjun", "Felix",
    "Kwame", "Lars", "Diego", "Hamza", "Tom", "Pavel", "Jonas", "Ravi", "Malik", "Hugo",
    "Sami", "Theo", "Emeka", "Viktor", "Luca", "Daniel", "Nikhil", "Oscar", "Yusuf", "Bruno",
)
SURNAMES = (
    "Garcia", "Okafor", "Novak", "Tanaka", "Schmidt", "Haddad", "Kowalski", "Silva", "Nguyen",
    "Andersen", "Moreau", "Rossi", "Petrov", "Mensah", "Khan", "Lindqvist", "Ortega", "Bauer",
    "Costa", "Ivanova", "Yilmaz", "Dubois", "Fischer", "Sato", "Popescu", "Horvat", "Reyes",
)
CITIES = (
    "Lisbon", "Nairobi", "Osaka", "Denver", "Krakow", "Porto Alegre", "Leeds", "Hanoi",
    "Tallinn", "Accra", "Montreal", "Seville", "Pune", "Gdansk", "Adelaide", "Bergen",
    "Valparaiso", "Tbilisi", "Lyon", "Austin", "Cork", "Busan", "Graz", "Ljubljana",
)
# (singular, plural, typical unit price range in dollars)
ITEMS = (
    ("notebook", "notebooks", (2, 9)), ("apple", "apples", (1, 3)), ("ticket", "tickets", (8, 40)),
    ("candle", "candles", (3, 12)), ("pen", "pens", (1, 4)), ("mug", "mugs", (5, 15)),
    ("plant", "plants", (4, 25)), ("sandwich", "sandwiches", (4, 11)), ("book", "books", (6, 30)),
    ("bracelet", "bracelets", (5, 20)), ("lamp", "lamps", (15, 60)), ("scarf", "scarves", (9, 35)),
    ("puzzle", "puzzles", (7, 28)), ("jar of honey", "jars of honey", (4, 14)),
    ("bag of rice", "bags of rice", (3, 16)), ("phone case", "phone cases", (6, 22)),
    ("towel", "towels", (4, 18)), ("cupcake", "cupcakes", (2, 6)), ("kite", "kites", (6, 26)),
    ("sticker sheet", "sticker sheets", (1, 5)), ("bike light", "bike lights", (9, 32)),
    ("loaf of bread", "loaves of bread", (2, 7)), ("pair of socks", "pairs of socks", (3, 12)),
)
CONTAINERS = (
    ("box", "boxes"), ("crate", "crates"), ("shelf", "shelves"), ("basket", "baskets"),
    ("bag", "bags"), ("tray", "trays"), ("drawer", "drawers"), ("bin", "bins"),
)
PLACES = (
    "the bakery", "a farmers' market", "the school fair", "a hardware store", "the library sale",
    "a corner shop", "the museum gift shop", "an online store", "the community garden",
    "a street market", "the train station kiosk", "the campus bookstore",
)
# Short scene-setting sentences users prepend; drawn at random so two word problems that
# share a template rarely share a whole sentence too.
CONTEXT_SENTENCES = (
    "This is from my kid's homework.", "I'm checking my own answer here.",
    "Our teacher gave us this one today.", "It came up while planning a budget.",
    "Stuck on this for a while, sorry if it's easy.", "It's from a practice worksheet.",
    "My friend and I got different results.", "Found this in an old puzzle book.",
    "Working through a revision sheet before an exam.", "A colleague asked me this at lunch.",
    "Trying to double-check a receipt.", "It's part of a quiz for new staff.",
)
PREAMBLES = (
    "Please answer carefully.", "Think step by step.", "Answer the following question.",
    "Read the problem below and solve it.", "Give only the final answer.",
    "Solve the following task.",
)
SYSTEM_PROMPTS = {
    "math": ("You are a careful math tutor.", "You are a helpful assistant. Be concise.",
             "You help students check arithmetic."),
    "code": ("You are an expert Python programmer.", "You are a helpful coding assistant.",
             "Answer with Python code only."),
    "json": ("You extract structured data and reply with JSON only.",
             "You are a data-entry assistant.", "Reply with a single JSON object."),
}
FOLLOW_UPS = (
    "That doesn't look right. Can you check again?", "Are you sure? Please recheck.",
    "Hmm, I got something different. Try once more.", "That failed for me, please fix it.",
    "No, that's wrong. Again please.", "Can you double-check that?",
)


def expand(template: str, rng: random.Random) -> str:
    """Replace every `[a|b|c]` group by one alternative (an empty one drops the phrase)."""
    return _ALTERNATIVES.sub(lambda m: rng.choice(m.group(1).split("|")), template)


def pick_person(rng: random.Random) -> tuple[str, str, str]:
    """A first name with its subject and possessive pronoun."""
    if rng.random() < 0.5:
        return rng.choice(NAMES_SHE), "she", "her"
    return rng.choice(NAMES_HE), "he", "his"


def full_name(rng: random.Random) -> str:
    first = rng.choice(NAMES_SHE if rng.random() < 0.5 else NAMES_HE)
    return f"{first} {rng.choice(SURNAMES)}"
