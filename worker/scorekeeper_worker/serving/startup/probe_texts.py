"""A fixed probe set of natural text for the int8 accuracy certificate: eight topics, a query and six passages each.

Every query is scored against all 48 passages, so each ranking has a few relevant passages on top of many that are
not, as a reranker's input has. Calibration uses other pairs of the same texts (a passage as the query of the
passages that follow it), never the certificate's (query, passage) pairs."""

from __future__ import annotations

TOPICS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("What is the capital of France?", (
        "Paris is the capital and largest city of France, on the river Seine.",
        "The French government, the president and the parliament all sit in Paris.",
        "Lyon and Marseille are large French cities, but neither is the capital.",
        "Versailles was the seat of the French court before the revolution of 1789.",
        "France is divided into regions, each with its own prefecture and council.",
        "The Eiffel Tower was built in Paris for the world's fair of 1889.",
    )),
    ("How do I sort a list in Python?", (
        "Call sorted(items) to get a new sorted list, or items.sort() to sort in place.",
        "Both accept a key function, for example sorted(words, key=len) sorts by length.",
        "Pass reverse=True to sort from the largest to the smallest element.",
        "Python's sort is stable: equal elements keep the order they had before.",
        "A dictionary keeps its keys in insertion order since Python 3.7.",
        "List comprehensions build a new list from an iterable in a single expression.",
    )),
    ("Why is the sky blue?", (
        "Sunlight is scattered by the molecules of the air, and blue light is scattered the most.",
        "Rayleigh scattering grows with the inverse fourth power of the wavelength.",
        "At sunset the light crosses more air, so the red and orange light reaches us.",
        "Clouds look white because their droplets scatter all colours about equally.",
        "On the Moon there is no atmosphere, and the sky is black even during the day.",
        "The ocean looks blue partly because water absorbs red light.",
    )),
    ("How much water should a dog drink every day?", (
        "A healthy dog drinks roughly one ounce of water per pound of body weight each day.",
        "Dogs need more water in hot weather and after exercise.",
        "A dog that suddenly drinks much more than usual should see a veterinarian.",
        "Puppies should be fed three or four small meals a day.",
        "Walking a dog twice a day keeps it fit and calm.",
        "Fresh water should always be available in a clean bowl.",
    )),
    ("What causes inflation?", (
        "Inflation rises when demand for goods grows faster than the economy can produce them.",
        "Central banks raise interest rates to slow down inflation.",
        "Higher energy prices push up the cost of almost everything else.",
        "When wages rise, companies may raise prices to cover their costs.",
        "A stock market index follows the prices of a group of shares.",
        "Printing money without more goods to buy tends to raise prices.",
    )),
    ("How do vaccines work?", (
        "A vaccine trains the immune system to recognise a virus or bacterium without causing the disease.",
        "After vaccination the body keeps memory cells that respond quickly to a later infection.",
        "Some vaccines contain a weakened or inactivated form of the germ.",
        "mRNA vaccines give cells instructions to make a harmless piece of a viral protein.",
        "Antibiotics treat bacterial infections but do not work against viruses.",
        "Washing hands with soap removes many germs from the skin.",
    )),
    ("Who wrote Pride and Prejudice?", (
        "Pride and Prejudice is a novel by Jane Austen, published in 1813.",
        "Jane Austen also wrote Emma, Persuasion and Sense and Sensibility.",
        "The novel follows Elizabeth Bennet and her meetings with Mr Darcy.",
        "Charlotte Bronte wrote Jane Eyre under the pen name Currer Bell.",
        "Many film and television versions of the story have been made.",
        "Charles Dickens published his novels in monthly parts.",
    )),
    ("How does a heat pump heat a house?", (
        "A heat pump moves heat from the outside air or ground into the house instead of burning fuel.",
        "It uses a refrigerant that evaporates outside and condenses inside, releasing heat.",
        "Heat pumps deliver three to four units of heat for each unit of electricity they use.",
        "The same machine can run in reverse and cool the house in summer.",
        "Good insulation reduces the heat a house loses through its walls and roof.",
        "Solar panels turn sunlight into electricity.",
    )),
)


def certificate_requests() -> list[tuple[str, list[str]]]:
    """(query, passages): every topic's query against all passages."""
    passages = [passage for _, topic in TOPICS for passage in topic]
    return [(query, passages) for query, _ in TOPICS]


def calibration_requests() -> list[tuple[str, list[str]]]:
    """(a passage, the passages after it): pairs the certificate never scores."""
    passages = [passage for _, topic in TOPICS for passage in topic]
    return [(passages[i], passages[i + 1:i + 13]) for i in range(0, len(passages) - 12, 3)]
