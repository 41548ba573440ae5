"""Lay out: what a trace shows, format aside. ``fold`` decides which ranks and how much history to draw,
``streams`` lays a rank's ops onto the streams that ran them, ``looks`` what slices share, ``timeline``
makes each rank's tracks (``scene``: tracks, slices, counters), and ``focus`` where the UI opens."""
