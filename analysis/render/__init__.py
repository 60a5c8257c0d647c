"""Drawing a report: shared presentation (`present`), the sections declared once
(`sections`), Markdown (`report_md`), HTML (`report_html`), plots (`plots`), and the files of
one report (`build`).
"""
