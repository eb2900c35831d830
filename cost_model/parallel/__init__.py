"""What each parallelism implies for the graph: tensor-parallel layouts, context and expert parallelism."""
