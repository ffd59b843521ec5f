"""Reading results: knee detection, comparison, diagnosis rules, cost."""
