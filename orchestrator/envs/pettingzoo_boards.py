"""Chess and Go for the PettingZoo adapter, as players read them.

PettingZoo encodes these two for networks: chess_v6 observes 8x8x111 planes and acts on 4672 ids
(mirrored for black), go_v5 observes NxNx17 planes and acts on N*N+1 ids. Here each game is drawn
from its own state (``env.unwrapped``) and each legal action id gets the name players use: UCI
for chess (``e2e4``, ``e7e8q``), a point or ``pass`` for Go (``d4``). Names are lowercase, as
``move_of`` compares them.
"""
from __future__ import annotations

from typing import Any

View = tuple[str, dict[str, int]]  # the text a player reads, and its legal moves: name -> action id

CHESS_HINT = ("Moves are UCI: the from and to squares (e2e4; castling is the king's move, e1g1), "
              "and a promotion names the new piece (e7e8q, e7e8n).")
GO_COLUMNS = "abcdefghjklmnopqrstuvwxyz"  # Go skips i
GO_HINT = "A move is a point, column letter then row number (d4), or pass; two passes in a row end the game."


def chess_view(game: Any, agent: str, legal: list[int]) -> View:
    import chess
    from pettingzoo.classic.chess.chess_utils import action_to_move

    board: chess.Board = game.board
    player = 0 if board.turn == chess.WHITE else 1
    # Named by the move env.step would play for each id: the same decoding, black's mirroring included.
    moves = {action_to_move(board, a, player).uci(): a for a in legal}
    rows = [f"{8 - i} {row}" for i, row in enumerate(str(board).splitlines())]
    lines = ["Board (uppercase: white, lowercase: black):", *rows, "  a b c d e f g h", f"FEN: {board.fen()}",
             f"You play {'white' if player == 0 else 'black'}."]
    if board.move_stack:
        lines.append(f"Last move: {board.peek().uci()}{', check' if board.is_check() else ''}.")
    return "\n".join([*lines, CHESS_HINT]), dict(sorted(moves.items()))


def go_view(game: Any, agent: str, legal: list[int]) -> View:
    size = len(game._go.board)
    points = [f"{GO_COLUMNS[col]}{size - row}" for row in range(size) for col in range(size)]  # id row*N + col
    moves = {(points[a] if a < size * size else "pass"): a for a in legal}
    # The stone planes name the players the other way round (plane 0 holds the last mover's
    # stones): drawn from the position itself, where black (the first agent) is 1.
    position, mine = game._go, 1 if agent == game.possible_agents[0] else -1
    width = len(str(size))
    rows = [f"{size - r:>{width}} " + " ".join("X" if v == mine else "O" if v == -mine else "." for v in row)
            for r, row in enumerate(position.board)]
    lines = ["Board (X: yours, O: your opponent's):", *rows, " " * width + " " + " ".join(GO_COLUMNS[:size]),
             f"You play {'black' if mine == 1 else 'white'}."]
    if position.recent:  # a pass shows nowhere on the board, and a second one ends the game
        last = position.recent[-1].move
        lines.append(f"Last move: {'pass' if last is None else points[last[0] * size + last[1]]}.")
    return "\n".join([*lines, GO_HINT]), moves


# By the adapter's game key (PettingZoo's name and version: the action encodings are per version).
BOARDS = {"chess_v6": chess_view, "go_v5": go_view}
