"""Demo math tasks: two-digit additions, other arithmetic, and short word problems.

Each sampler returns the prompt, the exact answer (a `Fraction`, printed as an integer,
a fraction or a decimal) and the worked steps; the failed response repeats those steps
with a plausible slip in the last one. Two-digit additions are a large share on purpose:
the tiny demo policy can learn them, so a training cycle shows a measurable gain.
"""
import random
import re
from decimal import Decimal
from fractions import Fraction

from flows.demo.data.vocab import CONTAINERS, CONTEXT_SENTENCES, ITEMS, PLACES, expand, pick_person

_NUMBER = re.compile(r"\d+")
ADDITION_SHARE = 0.32
ARITHMETIC_SHARE = 0.28

# The bare form comes first and is drawn most: it is what the demo policy is trained on.
_ADD_PHRASINGS = (
    "What is {a}+{b}?", "What is {a} + {b}?", "[Compute|Calculate|Work out] {a}+{b}.",
    "{a}+{b}=?", "What's {a} plus {b}?", "Add {a} and {b}.", "Find the sum of {a} and {b}.",
    "How much is {a} + {b}?", "[Quick one|Quick question]: {a}+{b}?",
    "What do you get when you add {a} to {b}?", "Please add {b} to {a}.",
)
_ADD_WEIGHTS = (8,) + (1,) * (len(_ADD_PHRASINGS) - 1)
_ASK = ("What is {e}?", "[Compute|Calculate|Evaluate] {e}.", "What's {e}?", "Find {e}.",
        "[Can you|Could you] [work out|compute] {e}?", "{e} = ?", "How much is {e}?",
        "Evaluate the expression {e}.", "[Quick check|Homework]: what is {e}?")


def fmt(value: Fraction, style: str = "int") -> str:
    """Print an exact value the way a person would write the answer."""
    if value.denominator == 1:
        return str(value.numerator)
    if style == "dec" and _terminates(value.denominator):
        return f"{Decimal(value.numerator) / Decimal(value.denominator):f}".rstrip("0").rstrip(".")
    return f"{value.numerator}/{value.denominator}"


def _money(value: Fraction) -> str:
    return fmt(value, "dec") if value.denominator == 1 else f"{float(value):.2f}"


def _terminates(denominator: int) -> bool:
    for prime in (2, 5):
        while denominator % prime == 0:
            denominator //= prime
    return denominator == 1


def _addition(rng: random.Random) -> tuple:
    a, b = rng.randint(10, 99), rng.randint(10, 99)
    text = expand(rng.choices(_ADD_PHRASINGS, _ADD_WEIGHTS)[0], rng).format(a=a, b=b)
    tens = a + b // 10 * 10
    steps = [(f"{a} + {b // 10 * 10}", tens), (f"{tens} + {b % 10}", a + b)]
    return text, Fraction(a + b), steps, "int", ("add", a, b)


def _arith_expression(rng: random.Random) -> tuple:
    kind = rng.randrange(9)
    r = rng.randint
    if kind == 0:
        a, b = (r(12, 99), r(12, 99)) if rng.random() < 0.6 else (r(101, 999), r(3, 9))
        return f"{a}*{b}" if rng.random() < 0.5 else f"{a} × {b}", [(f"{a} * {b}", Fraction(a * b))], "int"
    if kind == 1:
        a, b = r(300, 999), r(101, 299)
        return f"{a} - {b}", [(f"{a} - {b}", Fraction(a - b))], "int"
    if kind == 2:
        a, b, c = r(2, 60), r(2, 12), r(2, 12)
        return f"{a} + {b}*{c}", [(f"{b} * {c}", Fraction(b * c)), (f"{a} + {b * c}", Fraction(a + b * c))], "int"
    if kind == 3:
        a, b, c = r(2, 30), r(2, 30), r(2, 9)
        return f"({a} + {b}) * {c}", [(f"{a} + {b}", Fraction(a + b)), (f"{a + b} * {c}", Fraction((a + b) * c))], "int"
    if kind == 4:
        b, q = r(3, 19), r(4, 60)
        return f"{b * q} / {b}", [(f"{b * q} / {b}", Fraction(q))], "int"
    if kind == 5:
        a, e = r(2, 12), r(2, 4)
        return f"{a}^{e}", [(f"{a}^{e}", Fraction(a ** e))], "int"
    if kind == 6:
        p, base = rng.choice((5, 10, 12, 15, 20, 25, 30, 40, 75)), r(2, 40) * 20
        return f"{p}% of {base}", [(f"{base} * {p} / 100", Fraction(base * p, 100))], "dec"
    if kind == 7:
        a, b, c, d = r(1, 5), r(2, 9), r(1, 5), r(2, 9)
        value = Fraction(a, b) + Fraction(c, d)
        return f"{a}/{b} + {c}/{d}", [(f"{a}/{b} + {c}/{d}", value)], "frac"
    a, b = Fraction(r(11, 99), 10), Fraction(r(2, 40), 4)
    return (f"{fmt(a, 'dec')} * {fmt(b, 'dec')}", [(f"{fmt(a, 'dec')} * {fmt(b, 'dec')}", a * b)], "dec")


def _arithmetic(rng: random.Random) -> tuple:
    expression, steps, style = _arith_expression(rng)
    text = expand(rng.choice(_ASK), rng).format(e=expression)
    return text, steps[-1][1], steps, style, ("arith", expression)


def _shopping(rng, name, pron, pos):
    item, items, (lo, hi) = rng.choice(ITEMS)
    n, price = rng.randint(2, 15), Fraction(rng.randint(lo * 4, hi * 4), 4)
    bill = next(v for v in (20, 50, 100, 200, 500, 1000) if v > n * price)
    text = (f"{name} [buys|picks up|orders] {n} {items} at [{rng.choice(PLACES)}|the shop] for ${_money(price)} each "
            f"and pays with a ${bill} bill. How much change [does {pron} get|should {pron} receive]?")
    return text, [(f"{n} * {_money(price)}", n * price), (f"{bill} - {_money(n * price)}", bill - n * price)]


def _sharing(rng, name, pron, pos):
    k, each = rng.randint(3, 16), rng.randint(2, 40)
    extra = rng.randint(0, k - 1)
    _, items, _ = rng.choice(ITEMS)
    text = (f"{name} has {k * each + extra} {items}. {pron.capitalize()} [shares|splits] them equally among "
            f"{k} [friends|classmates|neighbours] and keeps the rest. How many does {pron} keep?")
    return text, [(f"{k * each + extra} mod {k}", extra)]


def _boxes(rng, name, pron, pos):
    box, boxes = rng.choice(CONTAINERS)
    n, per, sold = rng.randint(3, 14), rng.randint(4, 24), rng.randint(1, 30)
    _, items, _ = rng.choice(ITEMS)
    sold = min(sold, n * per - 1)
    text = (f"[A shop|{name}'s stall|The warehouse] has {n} {boxes} with {per} {items} in each {box}. "
            f"[After selling|Once it sells|It sells] {sold} of them, how many {items} are left?")
    return text, [(f"{n} * {per}", n * per), (f"{n * per} - {sold}", n * per - sold)]


def _speed(rng, name, pron, pos):
    speed, hours, minutes = rng.randint(30, 110), rng.randint(1, 6), rng.choice((0, 10, 15, 20, 30, 40, 45, 50))
    t = Fraction(hours) + Fraction(minutes, 60)
    text = (f"{name} [drives|cycles|travels] at {speed} km/h for {hours} h {minutes} min. "
            f"How many kilometres [does {pron} cover|is that]?")
    return text, [(f"{speed} * {fmt(t, 'dec')}", speed * t)]


def _ages(rng, name, pron, pos):
    other, _, _ = pick_person(rng)
    age, gap, years = rng.randint(6, 40), rng.randint(2, 25), rng.randint(2, 15)
    text = (f"{name} is {age} years old and {other} is {gap} years older. "
            f"In {years} years, what will be the sum of their ages?")
    return text, [(f"{age} + {age + gap}", 2 * age + gap), (f"{2 * age + gap} + 2 * {years}", 2 * age + gap + 2 * years)]


def _recipe(rng, name, pron, pos):
    base, cups, want = rng.randint(2, 12), rng.randint(1, 9), rng.randint(2, 40)
    ingredient = rng.choice(("flour", "sugar", "milk", "oats", "rice", "lentils", "water"))
    value = Fraction(cups * want, base)
    text = (f"A recipe for {base} [people|servings] uses {cups} cups of {ingredient}. "
            f"{name} wants to cook for {want}. How many cups of {ingredient} [are needed|does {pron} need]?")
    return text, [(f"{cups} * {want} / {base}", value)]


def _discount(rng, name, pron, pos):
    item, _, (lo, hi) = rng.choice(ITEMS)
    price, off = rng.randint(lo * 3, hi * 6), rng.randrange(5, 75, 5)
    value = Fraction(price * (100 - off), 100)
    text = (f"A {item} [costs|is priced at] ${price}. [During a sale|This week] it is {off}% off. "
            f"What [does {name} pay|is the sale price] in dollars?")
    return text, [(f"{price} * {off} / 100", Fraction(price * off, 100)), (f"{price} - {fmt(Fraction(price * off, 100), 'dec')}", value)]


def _rectangle(rng, name, pron, pos):
    w, h, price = rng.randint(3, 25), rng.randint(3, 25), rng.randint(2, 19)
    thing = rng.choice(("garden bed", "floor", "wall", "patio", "classroom rug", "balcony"))
    text = (f"{name}'s {thing} is {w} m by {h} m. [Covering|Tiling|Painting] it costs ${price} per square metre. "
            f"What is the total cost?")
    return text, [(f"{w} * {h}", w * h), (f"{w * h} * {price}", w * h * price)]


def _savings(rng, name, pron, pos):
    start, weekly, weeks = rng.randint(0, 90), rng.randint(3, 45), rng.randint(3, 20)
    text = (f"{name} [has|starts with] ${start} [saved|in a jar] and [adds|puts away] ${weekly} every week. "
            f"How much [will {pron} have|is saved] after {weeks} weeks?")
    return text, [(f"{weekly} * {weeks}", weekly * weeks), (f"{start} + {weekly * weeks}", start + weekly * weeks)]


def _pages(rng, name, pron, pos):
    total, per_day, days = rng.randint(150, 900), rng.randint(8, 45), rng.randint(2, 9)
    read = min(per_day * days, total - 1)
    text = (f"{name} is reading a {total}-page [novel|book|manual]. {pron.capitalize()} reads {per_day} pages a day "
            f"for {days} days. How many pages are left?")
    return text, [(f"{per_day} * {days}", read), (f"{total} - {read}", total - read)]


def _average(rng, name, pron, pos):
    scores = [rng.randint(40, 100) for _ in range(rng.randint(3, 5))]
    scores[-1] -= sum(scores) % len(scores)  # a whole-number mean reads like a real quiz
    value = Fraction(sum(scores), len(scores))
    text = (f"On {len(scores)} [tests|quizzes|games] {name} scored {', '.join(map(str, scores[:-1]))} and "
            f"{scores[-1]}. What is {pos} [average|mean] score?")
    return text, [(" + ".join(map(str, scores)), sum(scores)), (f"{sum(scores)} / {len(scores)}", value)]


def _temperature(rng, name, pron, pos):
    morning, rise, drop = rng.randint(-12, 18), rng.randint(2, 15), rng.randint(1, 20)
    city = rng.choice(("the mountain town", "the harbour", "the campsite", "the city centre"))
    text = (f"In {city} it was {morning} °C at 7 am. It [rose|went up] {rise} degrees by noon and then "
            f"[fell|dropped] {drop} degrees by midnight. What was the temperature at midnight?")
    return text, [(f"{morning} + {rise}", morning + rise), (f"{morning + rise} - {drop}", morning + rise - drop)]


def _tickets(rng, name, pron, pos):
    adults, kids, pa, pk = rng.randint(1, 5), rng.randint(1, 6), rng.randint(9, 30), rng.randint(3, 12)
    place = rng.choice(("the zoo", "a museum", "the cinema", "an aquarium", "a concert"))
    text = (f"Tickets for {place} cost ${pa} per adult and ${pk} per child. {name} buys tickets for "
            f"{adults} adults and {kids} children. What is the total?")
    return text, [(f"{adults} * {pa}", adults * pa), (f"{kids} * {pk}", kids * pk),
                  (f"{adults * pa} + {kids * pk}", adults * pa + kids * pk)]


_WORD_PROBLEMS = (_shopping, _sharing, _boxes, _speed, _ages, _recipe, _discount, _rectangle,
                  _savings, _pages, _average, _temperature, _tickets)
_WORD_ENDINGS = ("", "", "", " Show your working.", " Just give the number.", " Explain briefly.",
                 " Please include units.", " Thanks!", " I need this for a worksheet.")


def _word_problem(rng: random.Random) -> tuple:
    name, pron, pos = pick_person(rng)
    index = rng.randrange(len(_WORD_PROBLEMS))
    text, steps = _WORD_PROBLEMS[index](rng, name, pron, pos)
    text = core = expand(text, rng)
    if rng.random() < 0.3:
        text = f"{rng.choice(CONTEXT_SENTENCES)} {text}"
    text += rng.choice(_WORD_ENDINGS)
    steps = [(expr, Fraction(value)) for expr, value in steps]
    # Same template and numbers is the same problem, whatever the names and phrasing.
    return text, steps[-1][1], steps, "dec", ("word", index, tuple(_NUMBER.findall(core)))


def _wrong_value(rng: random.Random, value: Fraction) -> Fraction:
    if value.denominator != 1 and rng.random() < 0.5:
        return Fraction(value.numerator + 1, value.denominator)
    slip = rng.choice((1, -1, 10, -10, 2, -2, 100, 5))
    wrong = value + slip
    if value.denominator == 1 and 10 <= value < 1000 and value % 10 and rng.random() < 0.3:
        digits = str(value.numerator)
        swapped = Fraction(int(digits[::-1]))
        wrong = swapped if swapped != value else wrong
    return wrong


def _bad_response(rng: random.Random, steps: list, style: str) -> tuple[str, dict]:
    wrong = _wrong_value(rng, steps[-1][1])
    lines = [f"{expr} = {fmt(value, style)}" for expr, value in steps[:-1]]
    lines.append(f"{steps[-1][0]} = {fmt(wrong, style)}")
    ending = rng.choice(("So the answer is {w}.", "Answer: {w}", "The result is {w}.", "**{w}**"))
    text = ("\n" if len(lines) > 1 else " ").join(lines) + "\n" + ending.format(w=fmt(wrong, style))
    kind = rng.choice(("wrong_answer", "wrong_answer", "user_marked_incorrect"))
    detail = rng.choice(("user marked incorrect", f"grader: expected {fmt(steps[-1][1], style)}",
                         "thumbs down", "answer mismatch"))
    return text, {"kind": kind, "detail": detail}


def sample_math(rng: random.Random) -> dict:
    """One math task with its failed response (see `flows.demo.data.domains.sample_task`)."""
    roll = rng.random()
    if roll < ADDITION_SHARE:
        text, answer, steps, style, key = _addition(rng)
    elif roll < ADDITION_SHARE + ARITHMETIC_SHARE:
        text, answer, steps, style, key = _arithmetic(rng)
    else:
        text, answer, steps, style, key = _word_problem(rng)
    response, failure = _bad_response(rng, steps, style)
    gold = fmt(answer, style)
    return {"domain": "math", "prompt": text, "reference": {"answer": gold}, "gold": gold,
            "key": key, "response": response, "failure": failure}
