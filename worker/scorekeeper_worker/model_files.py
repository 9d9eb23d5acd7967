"""`python -m scorekeeper_worker.model_files`: the stable entry point of `model/files.py` (README, Dockerfile)."""

from scorekeeper_worker.model.files import main

if __name__ == "__main__":
    main()
